"""Loads on purpose and keep-alive through the shell: POST /models/load and /models/unload, ``preload``, the
``[router] ttl``, a request's ``keep_alive`` and ``max_keep_alive``, and a load abandoned by its client.

Simulated llama-servers; models a and b share GPU 0 (one model at a time) unless said otherwise.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import httpx
import trio

from statemachine import KillCause, ReplicaPhase
from tests.support.client import assert_openai_error, chat_body, post_chat
from tests.support.harness import running_router
from tests.support.waiting import until

TWO = {"a": {}, "b": {}}


def phases(h: object, model: str) -> list[ReplicaPhase]:
    return [r.phase for r in h.router.state.replicas if r.model == model]  # type: ignore[attr-defined]


async def test_models_load_loads_ahead_and_unload_lets_go(tmp_path: Path) -> None:
    async with running_router(tmp_path, TWO) as h:
        reply = await h.client.post("/models/load", json={"model": "b"})
        assert reply.status_code == 200 and reply.json() == {"success": True, "model": "b", "action": "load"}
        await h.wait_ready("b")
        spawned = h.router.state.next_replica
        assert (await post_chat(h.client, "b", max_tokens=1)).status_code == 200
        assert h.router.state.next_replica == spawned, "the request found b loaded"
        # a load asked for evicts the idle resident
        assert (await h.client.post("/models/load", json={"model": "a"})).status_code == 200
        await h.wait_ready("a")
        assert phases(h, "b") == []
        reply = await h.client.post("/models/unload", json={"model": "a"})
        assert reply.status_code == 200 and reply.json()["action"] == "unload"
        await until(lambda: not h.router.state.replicas, what="a unloaded")


async def test_models_load_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    pools = {"both": {"members": ["a", "b"]}}
    async with running_router(tmp_path, TWO, pools=pools) as h:
        missing = assert_openai_error(await h.client.post("/models/load", json={}), 400)
        assert missing["code"] == "model_required" and '{"model": "NAME"}' in missing["message"]
        unknown = assert_openai_error(await h.client.post("/models/load", json={"model": "zz"}), 404)
        assert unknown["code"] == "model_not_found" and "a, b" in unknown["message"]
        pool = assert_openai_error(await h.client.post("/models/unload", json={"model": "both"}), 400)
        assert pool["code"] == "pool_not_allowed" and "a, b" in pool["message"]
        typed = assert_openai_error(await h.client.post("/models/load", json={"model": 3}), 400)
        assert typed["code"] == "invalid_type"
        form = await h.client.post("/models/load", content=b"model=a", headers={"content-type": "text/plain"})
        assert form.status_code == 415, form.text
        assert not h.router.state.replicas and not h.router.state.wanted


async def test_preload_loads_in_order_at_start(tmp_path: Path) -> None:
    models = {"a": {"gpus": [0]}, "b": {"gpus": [1]}}
    devices = {"0": {"memory_mib": 4096}, "1": {"memory_mib": 4096}}
    async with running_router(tmp_path, models, router={"preload": ["b", "a"]}, devices=devices) as h:
        await h.wait_ready("a")
        await h.wait_ready("b")
        by_id = sorted(h.router.state.replicas, key=lambda r: r.id)
        assert [r.model for r in by_id] == ["b", "a"] and all(r.asked for r in by_id)


async def test_router_ttl_is_every_models_default_and_keep_alive_replaces_it(tmp_path: Path) -> None:
    models = {"a": {"gpus": [0]}, "b": {"ttl": 3600, "gpus": [1]}}
    devices = {"0": {"memory_mib": 4096}, "1": {"memory_mib": 4096}}
    async with running_router(tmp_path, models, router={"ttl": 0.5}, devices=devices) as h:
        assert h.router.state.settings.models["a"].ttl == 0.5
        assert h.router.state.settings.models["b"].ttl == 3600
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        await until(lambda: phases(h, "a") == [], what="a stopped after the router's ttl")
        # b's own ttl is an hour; a request asks for 0: b stops once idle
        assert (await post_chat(h.client, "b", max_tokens=1, keep_alive=0)).status_code == 200
        await until(lambda: phases(h, "b") == [], what="b stopped at once (keep_alive 0)")
        stops = [x for x in h.router.happenings if x.kind == "stop"]
        assert [x.cause for x in stops] == [KillCause.IDLE_TTL, KillCause.IDLE_TTL]
        assert "(keep_alive)" in stops[-1].reason


async def test_keep_alive_forms_and_the_bound(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {}}, router={"max_keep_alive": 600}) as h:
        for value, seconds in (
            ("10m", 600.0),
            ("-1", 600.0),
            (-1, 600.0),
            ("90s", 90.0),
            (30, 30.0),
            ("1h", 600.0),
        ):
            reply = await post_chat(h.client, "a", max_tokens=1, keep_alive=value)
            assert reply.status_code == 200, reply.text
            assert h.router.state.keep_alive["a"] == seconds, value
        for bad in ("soon", True, [1], "10 minutes"):
            error = assert_openai_error(await post_chat(h.client, "a", keep_alive=bad), 400)
            assert error["code"] == "invalid_keep_alive" and '"10m"' in error["message"], error
    async with running_router(tmp_path / "free", {"a": {}}) as h:
        assert (await post_chat(h.client, "a", max_tokens=1, keep_alive=-1)).status_code == 200
        assert h.router.state.keep_alive["a"] == math.inf


async def test_a_load_abandoned_by_its_client_stops_and_the_next_waiter_loads(tmp_path: Path) -> None:
    models = {"a": {"sim": {"load_delay": 30.0}}, "b": {}}
    async with running_router(tmp_path, models) as h, trio.open_nursery() as nursery:

        async def impatient() -> None:
            with contextlib.suppress(httpx.TimeoutException):  # it gives up during the load
                await h.client.post("/v1/chat/completions", json=chat_body("a"), timeout=httpx.Timeout(0.5))

        nursery.start_soon(impatient)
        await until(lambda: phases(h, "a") == [ReplicaPhase.LOADING], what="a loading")
        waiter = trio.Event()
        answers: list[int] = []

        async def patient() -> None:
            answers.append((await post_chat(h.client, "b", max_tokens=1)).status_code)
            waiter.set()

        nursery.start_soon(patient)
        with trio.fail_after(20):
            await waiter.wait()
        assert answers == [200]
        stops = [x for x in h.router.happenings if x.kind == "stop" and x.model == "a"]
        assert [x.cause for x in stops] == [KillCause.ABANDONED], stops
