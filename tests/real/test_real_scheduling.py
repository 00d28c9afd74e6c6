"""Ordering, cancellation and concurrency against the real llama-server on tiny generated models.

Every timing claim is read from the arrival time of streamed tokens, never from sleeps.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.client import SseEvent, StreamResult, max_overlap, stream
from tests.support.realharness import long_body, real_router
from tests.support.waiting import until

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"


async def test_order_across_a_swap(tmp_path: Path) -> None:
    """Long A, then B, then A again: answered A, B, A although A had a free slot for the third."""
    models = {"a": {"parallel": 2, "ctx": 4096}, "b": {"shape": "other"}}
    async with real_router(tmp_path, models, router={"queue_head_grace": 0.0}) as rt:
        results: dict[str, StreamResult] = {}
        started = trio.Event()

        async def run(name: str, body: dict[str, object]) -> None:
            def seen(event: SseEvent) -> None:
                if name == "a1" and event.data:
                    started.set()

            results[name] = await stream(rt.client, CHAT, body, on_event=seen)
            started.set()  # a reply without tokens (an error) must not leave the test waiting

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "a1", long_body("a", 1200))
            await started.wait()
            nursery.start_soon(run, "b", long_body("b", 8))
            await rt.wait_state(lambda s: any(r.target == "b" for r in s.requests.values()))  # b is in first
            nursery.start_soon(run, "a2", long_body("a", 8))
        for name in ("a1", "b", "a2"):
            assert results[name].status == 200, results[name].body[:500]
            assert results[name].done, name
        a1, b, a2 = results["a1"], results["b"], results["a2"]
        assert a1.last_token_at < b.first_token_at, "B began before the long A ended"
        assert b.last_token_at < a2.first_token_at, "the second A overtook B, which needed a swap"


async def test_dropped_client_frees_its_slot(tmp_path: Path) -> None:
    """Both slots busy; one client leaves; two short requests finish before the surviving long one."""
    async with real_router(tmp_path, {"a": {"parallel": 2, "ctx": 6144}}) as rt:
        results: dict[str, StreamResult] = {}
        both = [trio.Event(), trio.Event()]
        ended = [trio.Event(), trio.Event()]

        async def long(index: int, drop: int | None) -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    both[index].set()

            results[f"long{index}"] = await stream(
                rt.client, CHAT, long_body("a", 2500), drop_after=drop, on_event=seen
            )
            both[index].set()
            ended[index].set()

        async def short(name: str) -> None:
            results[name] = await stream(rt.client, CHAT, long_body("a", 4))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long, 0, None)
            nursery.start_soon(long, 1, 20)
            await both[0].wait()
            await ended[1].wait()
            nursery.start_soon(short, "s1")
            nursery.start_soon(short, "s2")
        survivor = results["long0"]
        assert results["long1"].dropped
        assert survivor.done and len(survivor.tokens) >= 2000
        for name in ("s1", "s2"):
            assert results[name].done, results[name].body[:300]
            assert results[name].ended_at < survivor.last_token_at, f"{name} waited for the survivor"


async def test_n_clients_p_slots_generate_together(tmp_path: Path) -> None:
    """Four clients, three slots: three generate at the same instant, as the replica's /slots confirms."""
    async with real_router(tmp_path, {"a": {"parallel": 3, "ctx": 6144}}) as rt:
        results: list[StreamResult] = []
        busy_seen: list[int] = []
        first = trio.Event()

        async def client(i: int) -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    first.set()

            results.append(await stream(rt.client, CHAT, long_body("a", 1800, f"story {i}"), on_event=seen))
            first.set()

        async def watch_slots() -> None:
            # Ask the replica itself (not through the router, whose slots are all taken) until it says
            # three generate (or the deadline passes).
            await first.wait()
            port = (await rt.status())["replicas"][0]["port"]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as direct:

                async def three_busy() -> bool:
                    reply = await direct.get("/slots")
                    busy_seen.append(sum(1 for s in reply.json() if s.get("is_processing")))
                    return busy_seen[-1] == 3 or len(results) == 4

                await until(three_busy, timeout=120)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(client, i)
            nursery.start_soon(watch_slots)
        assert all(r.done for r in results)
        spans = [(r.first_token_at, r.last_token_at) for r in results]
        assert max_overlap(spans) == 3
        assert max(busy_seen) == 3, busy_seen


async def test_swap_and_back_then_crash_reload_and_cache(tmp_path: Path) -> None:
    """A → B → A swaps on one GPU; a SIGKILLed replica is reaped and reloads; a repeat reuses the cache."""
    models = {"a": {"parallel": 1}, "b": {"shape": "other"}}
    async with real_router(tmp_path, models) as rt:
        pids = []
        for name in ("a", "b", "a"):
            reply = await rt.client.post(CHAT, json=long_body(name, 4))
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-router-model"] == name
            status = await rt.status()
            assert [r["model"] for r in status["replicas"] if r["state"] == "ready"] == [name]
            pids.append(status["replicas"][0]["pid"])
        assert len(set(pids)) == 3
        kinds = [h["kind"] for h in (await rt.status())["recent"]]
        assert kinds.count("load") == 3 and kinds.count("stop") == 2

        os.kill(pids[-1], signal.SIGKILL)
        await rt.wait_state(lambda s: not s.replicas)
        body = long_body("a", 4, "The same prompt, twice over, so that the second is served from the cache.")
        first = await rt.client.post(CHAT, json=body)
        assert first.status_code == 200, first.text
        second = await rt.client.post(CHAT, json=body)
        assert second.json()["timings"]["cache_n"] > 0
        status = await rt.status()
        assert status["replicas"][0]["pid"] not in pids
        assert any(h["kind"] == "exited" and "SIGKILL" in h["reason"] for h in status["recent"])


async def test_a_swap_closes_the_idle_connections_to_the_replica_it_stops(tmp_path: Path) -> None:
    """llama-server waits for its idle kept-alive connections before it exits on SIGTERM (about 0.1 s
    each swap): when the router stops a replica it first closes the connections it keeps to it."""
    models = {"a": {"parallel": 2}, "b": {"shape": "other"}}
    async with real_router(tmp_path, models, router={"num_gpus": 1}) as rt:
        (pool,) = [listener.__self__ for listener in rt.router.stop_listeners]  # the data path's connections
        first = await rt.client.post(CHAT, json=long_body("a", 2))
        assert first.status_code == 200
        (replica_a,) = rt.router.state.replicas
        port_a = rt.router.ports[replica_a.id]
        assert port_a in pool.describe()["ports"]  # kept for the next request to a
        second = await rt.client.post(CHAT, json=long_body("b", 2))
        assert second.status_code == 200 and second.headers["x-router-model"] == "b"
        assert port_a not in pool.describe()["ports"]
        stops = [h for h in rt.router.happenings if h.kind == "stop" and h.replica == replica_a.id]
        assert stops and stops[0].cause == "evicted"
