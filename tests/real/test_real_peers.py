"""Two routers on this machine, each with a real llama-server replica, peering with each other over loopback.

Router ``b`` serves ``far``; router ``a`` serves ``near`` and discovers ``far`` from ``b``; pool ``auto`` on
``a`` tries ``near`` first, then ``far``. Both list a model ``ghost`` as the other's, so a request for it
would go round for ever without the hop rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from router.shell.ports import free_port
from tests.support.client import SseEvent, hold_busy, stream
from tests.support.harness import RouterHandle, serving
from tests.support.realharness import long_body, real_document
from tests.support.waiting import until

pytestmark = pytest.mark.real


@contextlib.asynccontextmanager
async def two_routers(
    tmp_path: Path, b_peer_url: str | None = None
) -> AsyncIterator[tuple[RouterHandle, RouterHandle]]:
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    doc_b = real_document(
        tmp_path / "b",
        {"far": {"parallel": 1, "shape": "other", "load_on_startup": True}},
        router={"port": port_b},
    )
    doc_b["peers"] = {"a": {"url": url_a, "models": ["ghost"], "api_key": "key-of-a"}}
    doc_b["router"]["api_keys"] = ["key-of-b"]
    doc_a = real_document(tmp_path / "a", {"near": {"parallel": 1}}, router={"port": port_a})
    doc_a["router"]["api_keys"] = ["key-of-a"]
    doc_a["peers"] = {
        "b": {
            "url": b_peer_url or url_b + "/v1",
            "api_key": "key-of-b",
            "refresh": 2.0,
            "connect_timeout": 2.0,
        },
        "b2": {"url": url_b, "models": ["ghost"], "api_key": "key-of-b"},
    }
    doc_a["pools"] = {"auto": {"members": ["near", "far"], "fallback": True}}
    async with (
        serving(tmp_path / "b", doc_b, client_timeout=120.0) as b,
        serving(tmp_path / "a", doc_a, client_timeout=120.0) as a,
    ):
        a.client.headers["authorization"] = "Bearer key-of-a"
        b.client.headers["authorization"] = "Bearer key-of-b"
        yield a, b


async def _models(handle: RouterHandle) -> dict[str, dict[str, Any]]:
    reply = await handle.client.get("/v1/models")
    reply.raise_for_status()
    return {entry["id"]: entry for entry in reply.json()["data"]}


async def _wait_for_model(handle: RouterHandle, name: str, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        await handle.router.wait_until(lambda s: name in s.settings.models)


async def test_a_peer_serves_its_models_here_and_a_pool_falls_back_to_it(tmp_path: Path) -> None:
    async with two_routers(tmp_path) as (a, b):
        await a.wait_ready("near", timeout=60)
        await b.wait_ready("far", timeout=60)
        await _wait_for_model(a, "far")
        listed = await _models(a)
        assert listed["far"]["peer"] == "b" and listed["near"].get("peer") is None
        assert "ghost" not in {e["id"] for e in (await _models(b)).values() if not e.get("peer")}

        direct = await a.client.post("/v1/chat/completions", json=long_body("far", 4))
        assert direct.status_code == 200, direct.text
        assert direct.headers["x-router-model"] == "far" and direct.json()["model"] == "far"

        # Streams are relayed from the peer as they come.
        events: list[SseEvent] = []
        await stream(
            a.client, "/v1/chat/completions", {**long_body("far", 8), "stream": True}, on_event=events.append
        )
        assert sum(1 for e in events if e.data and e.data != "[DONE]") >= 8

        # A client that leaves a stream relayed from the peer frees the peer's slot at once: the next request
        # for far gets it (far has one slot) and the peer's router holds nothing afterwards.
        left = await stream(a.client, "/v1/chat/completions", long_body("far", 1900), drop_after=3)
        assert left.dropped
        with trio.fail_after(10):
            await b.router.wait_until(lambda s: not s.requests)
            await a.router.wait_until(lambda s: not s.requests)

        async def cut_row() -> dict[str, Any] | None:
            rows = (await b.client.get("/history", params={"limit": 50})).json()["rows"]
            return next((r for r in rows if r["status"] == 499), None)

        cut = await until(cut_row, what="the peer's 499 row")
        assert cut["model_served"] == "far" and (cut["generated_tokens"] or 0) < 1900
        after = await a.client.post("/v1/chat/completions", json=long_body("far", 2))
        assert after.status_code == 200

        status = (await a.status())["peers"]
        b_entry = next(p for p in status if p["name"] == "b")
        assert b_entry["state"] == "up" and "far" in b_entry["models"] and b_entry["discovered"]
        assert b_entry["max_in_flight"] == 1  # the capacity b advertises: far's one slot
        metrics = (await a.client.get("/metrics")).text
        assert 'llama_router_peer_up{peer="b"} 1.0' in metrics
        assert 'llama_router_peer_max_in_flight{peer="b"} 1.0' in metrics

        # With near busy, the pool's next request goes to the peer before any byte is sent.
        async with trio.open_nursery() as nursery:
            await hold_busy(nursery, a.client, "/v1/chat/completions", long_body("near", 1900))
            reply = await a.client.post("/v1/chat/completions", json=long_body("auto", 4))
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-router-model"] == "far" and reply.json()["model"] == "far"
            nursery.cancel_scope.cancel()
        await a.wait_idle(timeout=30)


async def test_a_request_that_would_go_round_between_two_peers_is_refused(tmp_path: Path) -> None:
    async with two_routers(tmp_path) as (a, b):
        await _wait_for_model(a, "ghost")
        await _wait_for_model(b, "ghost")
        with trio.fail_after(10):
            reply = await a.client.post("/v1/chat/completions", json=long_body("ghost", 4))
        assert reply.status_code == 508, reply.text
        error = reply.json()["error"]
        assert error["code"] == "loop_detected" and "not forwarded a second time" in error["message"]
        # Without the router's key, another router's hop mark is no way in either.
        bare = await b.client.post(
            "/v1/chat/completions",
            json=long_body("far", 2),
            headers={"authorization": "Bearer wrong", "x-llama-router-hop": "1"},
        )
        assert bare.status_code == 401


async def test_a_peer_that_is_down_answers_within_seconds_and_never_blocks_local_models(
    tmp_path: Path,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with two_routers(tmp_path, b_peer_url=dead) as (a, _b):
        await a.wait_ready("near", timeout=60)
        with trio.fail_after(20):
            await a.router.wait_until(lambda s: "b" in s.peers_down)
        entry = next(p for p in (await a.status())["peers"] if p["name"] == "b")
        assert entry["state"] == "down"
        assert "cannot connect" in entry["reason"] or "connection" in entry["reason"]
        # far was never discovered: unknown here, with the list of what is served.
        missing = await a.client.post("/v1/chat/completions", json=long_body("far", 2))
        assert missing.status_code == 404
        # The pool serves from its local member; the local model answers as ever.
        with trio.fail_after(30):
            pooled = await a.client.post("/v1/chat/completions", json=long_body("auto", 2))
            local = await a.client.post("/v1/chat/completions", json=long_body("near", 2))
        assert pooled.status_code == 200 and pooled.headers["x-router-model"] == "near"
        assert local.status_code == 200


async def test_a_listed_model_of_a_peer_that_is_down_fails_fast(tmp_path: Path) -> None:
    dead = free_port()
    (tmp_path / "a").mkdir()
    doc = real_document(tmp_path / "a", {"near": {"parallel": 1}})
    doc["peers"] = {"gone": {"url": f"http://127.0.0.1:{dead}", "models": ["remote"], "connect_timeout": 1.0}}
    doc["pools"] = {"either": {"members": ["remote", "near"], "fallback": True}}
    async with serving(tmp_path / "a", doc, client_timeout=60.0) as a:
        await a.wait_ready("near", timeout=60)
        with trio.fail_after(10):
            reply = await a.client.post("/v1/chat/completions", json=long_body("remote", 2))
        assert reply.status_code in (502, 503), reply.text
        assert "gone" in reply.json()["error"]["message"]
        with trio.fail_after(30):
            pooled = await a.client.post("/v1/chat/completions", json=long_body("either", 2))
        assert pooled.status_code == 200 and pooled.headers["x-router-model"] == "near"
