"""Fewer swaps against the real llama-server: batching per model and the hold for a client that comes back.

Models a and b share GPU 0, one at a time. Every ordering claim is read from the arrival times of streamed
tokens; the swaps are counted from the replicas the router started.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.client import SseEvent, StreamResult, stream
from tests.support.harness import queued_for
from tests.support.realharness import long_body, real_router

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
MODELS = {"a": {"ctx": 4096}, "b": {"shape": "other"}}


async def test_the_loaded_model_serves_a_batch_before_the_swap(tmp_path: Path) -> None:
    """A long request to a, then one to b, then three more to a (swap_batch_max = 2): the first two of them
    are answered before b, the third after it — two swaps instead of three."""
    router = {"swap_batch_max": 2, "swap_batch_window": 600.0, "swap_hold": 0.0}
    async with real_router(tmp_path, MODELS, router=router) as rt:
        results: dict[str, StreamResult] = {}
        started = trio.Event()

        async def run(name: str, body: dict[str, object]) -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    started.set()

            results[name] = await stream(rt.client, CHAT, body, on_event=seen)
            started.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "a1", long_body("a", 1200))
            await started.wait()
            nursery.start_soon(run, "b", long_body("b", 8))
            await rt.wait_state(lambda s: queued_for(s, "b") == 1)
            for count, name in enumerate(("a2", "a3", "a4"), 1):
                nursery.start_soon(run, name, long_body("a", 8))
                await rt.wait_state(lambda s, n=count: queued_for(s, "a") == n)
        for name in ("a1", "a2", "a3", "b", "a4"):
            assert results[name].status == 200 and results[name].done, (name, results[name].body[:300])
        order = sorted(results, key=lambda n: results[n].first_token_at)
        assert order == ["a1", "a2", "a3", "b", "a4"], order
        state = rt.router.state
        assert state.next_replica - 1 == 3, "a, b, then a again: three loads"


async def test_an_agent_that_comes_back_keeps_its_model(tmp_path: Path) -> None:
    """An agent sends its next request to a only after each reply, while b waits for the swap: a is held
    for it (swap_hold), so its three requests are answered before b without a swap in between."""
    router = {"swap_batch_max": 4, "swap_batch_window": 600.0, "swap_hold": 3.0}
    async with real_router(tmp_path, MODELS, router=router) as rt:
        results: dict[str, StreamResult] = {}
        started = trio.Event()

        async def agent() -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    started.set()

            results["a1"] = await stream(rt.client, CHAT, long_body("a", 600), on_event=seen)
            started.set()
            for name in ("a2", "a3"):
                results[name] = await stream(rt.client, CHAT, long_body("a", 8))

        async def other() -> None:
            results["b"] = await stream(rt.client, CHAT, long_body("b", 8))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent)
            await started.wait()
            nursery.start_soon(other)
        for name in ("a1", "a2", "a3", "b"):
            assert results[name].status == 200 and results[name].done, (name, results[name].body[:300])
        assert results["a3"].last_token_at < results["b"].first_token_at, "b was swapped in between"
        assert rt.router.state.next_replica - 1 == 2, "a once and b once: no swap back and forth"
