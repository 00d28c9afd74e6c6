"""Models the scheduler places (``gpus = "any"``) against the real llama-server: two declared cards, three
models, one card each while they last, and a swap that takes the idle card, never the busy one."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.client import SseEvent, StreamResult, post_chat, stream
from tests.support.harness import RouterHandle
from tests.support.realharness import long_body, real_router

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
MODELS = {
    "a": {"gpus": "any"},
    "b": {"gpus": "any", "shape": "other"},
    "c": {"gpus": "any", "shape": "wide"},
}
DEVICES = {"0": {"memory_mib": 1024}, "1": {"memory_mib": 1024}}


def cards(rt: RouterHandle, model: str) -> list[tuple[int, ...]]:
    state = rt.router.state
    return [r.gpus for r in state.replicas if r.model == model and r.phase != "stopping"]


async def test_one_card_each_then_the_idle_card_is_swapped(tmp_path: Path) -> None:
    """a loads on card 0 and starts a long reply; b loads on card 1 and answers (b is now the model used
    last); c needs a card: it takes b's idle one rather than wait for busy a, the least recently used."""
    async with real_router(tmp_path, MODELS, devices=DEVICES) as rt:
        assert (await post_chat(rt.client, "a", max_tokens=1)).status_code == 200
        (first_a,) = [r.id for r in rt.router.state.replicas if r.model == "a"]
        result: dict[str, StreamResult] = {}
        started = trio.Event()

        async def long_a() -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    started.set()

            result["a"] = await stream(rt.client, CHAT, long_body("a", 1900), on_event=seen)
            started.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_a)
            await started.wait()
            assert (await post_chat(rt.client, "b", max_tokens=1)).status_code == 200
            assert (cards(rt, "a"), cards(rt, "b")) == ([(0,)], [(1,)])
            reply = await post_chat(rt.client, "c", max_tokens=1)
            assert reply.status_code == 200, reply.text
            assert "a" not in result, "the long reply of a ended before c was placed"
            assert cards(rt, "c") == [(1,)] and not cards(rt, "b")
        assert result["a"].status == 200 and result["a"].done
        assert [r.id for r in rt.router.state.replicas if r.model == "a"] == [first_a]  # never stopped
        status = await rt.status()
        assert {g["id"]: g["residents"] for g in status["gpus"]} == {0: ["a"], 1: ["c"]}
