"""Peers against simulated replicas: a peer that answers 5xx before any byte is a capacity miss for a pool and
a clear answer for a direct request; a peer's in-flight limit holds requests in this router's queue."""

from __future__ import annotations

from pathlib import Path

import trio

from statemachine import RequestClass, State
from tests.support.client import chat_body
from tests.support.harness import running_router, serving
from tests.support.simconfig import config_document


async def test_a_peer_answering_5xx_sends_a_pooled_request_to_the_next_member(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    async with running_router(tmp_path / "b", {"far": {"sim": {"oom_at_load": True}}}) as b:
        peers = {"box": {"url": b.url, "models": ["far"]}}
        pools = {"either": {"members": ["far", "near"], "fallback": True}}
        async with running_router(tmp_path / "a", {"near": {}}, peers=peers, pools=pools) as a:
            await a.wait_ready("near")
            pooled = await a.client.post("/v1/chat/completions", json=chat_body("either", "hello"))
            assert pooled.status_code == 200, pooled.text
            assert pooled.headers["x-router-model"] == "near"
            direct = await a.client.post("/v1/chat/completions", json=chat_body("far", "hello"))
            assert direct.status_code == 503, direct.text
            error = direct.json()["error"]
            assert error["code"] == "peer_failed"
            assert "peer 'box' serving 'far' failed: it answered 503" in error["message"]
            streamed = await a.client.post(
                "/v1/chat/completions", json={**chat_body("far", "x"), "stream": True}
            )
            assert streamed.status_code == 503 and streamed.json()["error"]["code"] == "peer_failed"
            rows = (await a.client.get("/history", params={"limit": 10})).json()["rows"]
            assert {(r["model_served"], r["status"]) for r in rows} >= {("near", 200)}
            await a.wait_idle()


async def test_requests_beyond_a_peers_limit_wait_here_and_go_in_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    async with running_router(tmp_path / "b", {"far": {"parallel": 4}}) as b:
        peers = {"box": {"url": b.url, "models": ["far"], "max_in_flight": 1}}
        async with running_router(tmp_path / "a", {"near": {}}, peers=peers) as a:
            finished: list[int] = []
            most = 0

            async def one(i: int) -> None:
                reply = await a.client.post(
                    "/v1/chat/completions", json={**chat_body("far", f"n{i}"), "max_tokens": 4}
                )
                assert reply.status_code == 200, reply.text
                finished.append(i)

            def watch(state: State) -> bool:  # called at every change of b's state: never satisfied
                nonlocal most
                most = max(most, len(state.requests))
                return False

            async with trio.open_nursery() as nursery:
                nursery.start_soon(b.router.wait_until, watch)
                async with trio.open_nursery() as clients:
                    for i in range(4):
                        clients.start_soon(one, i)
                        await a.wait_state(lambda s, n=i + 1: s.next_seq > n)
                nursery.cancel_scope.cancel()
            assert finished == [0, 1, 2, 3]
            assert most == 1  # the peer never held more than max_in_flight of them


async def test_a_request_reaches_its_peer_in_the_class_it_is_served_in_here(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    async with running_router(tmp_path / "b", {"far": {"sim": {"tokens": 40, "token_rate": 20.0}}}) as b:
        peers = {"box": {"url": b.url, "models": ["far"]}}
        doc = config_document(tmp_path / "a", {"near": {}}, peers=peers)
        doc["keys"] = {"bot": {"key": "sk-bot-0000", "class": "batch"}, "me": {"key": "sk-me-0000"}}
        async with serving(tmp_path / "a", doc) as a:
            classes: list[RequestClass] = []

            async def send() -> None:
                # the key's class here is batch; the header it forges asks for more, and is not passed on
                headers = {"Authorization": "Bearer sk-bot-0000", "x-router-class": "interactive"}
                body = {**chat_body("far", "x"), "max_tokens": 2}
                reply = await a.client.post("/v1/chat/completions", json=body, headers=headers)
                assert reply.status_code == 200, reply.text

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                state = await b.wait_state(lambda s: bool(s.requests))
                classes += [r.klass for r in state.requests.values()]
            assert classes == [RequestClass.BATCH]
