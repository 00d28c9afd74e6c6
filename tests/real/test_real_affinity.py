"""Prefix affinity on real llama-server replicas: two conversations with long prompts on one model with two
single-slot replicas. Each turn after the first goes back to the replica that served the conversation before,
and llama-server takes most of its prompt from that slot (``timings.cache_n``). Least-busy routing would send
both conversations to the first replica whenever both are idle, where the other conversation's prompt sits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from router.shell.ticket import Ticket
from tests.support.client import hold_busy
from tests.support.realharness import real_router

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
MODELS = {"a": {"num_instance": 2, "parallel": 1, "ctx": 4096, "load_on_startup": True}}
MANUAL = " ".join(f"Rule {n}: keep the answer short, cite the section and stay on topic." for n in range(40))


def body(topic: str, turn: int, tokens: int = 4) -> dict[str, Any]:
    """Turn ``turn`` of the conversation about ``topic``: a long system prompt, then the turns so far."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You help with {topic}. {MANUAL}"}]
    for n in range(1, turn + 1):
        question = f"Question {n} about {topic}: " + "what next? " * 20
        messages.append({"role": "user", "content": question})
        if n < turn:
            answer = f"Answer {n} about {topic}: " + "then this. " * 12
            messages.append({"role": "assistant", "content": answer})
    return {"model": "a", "messages": messages, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0}


async def test_each_conversation_returns_to_its_cached_prompt(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS) as rt:
        await rt.wait_ready("a", 2, timeout=60)
        tickets: list[Ticket] = []
        admit = rt.router.admit

        def recording(*args: Any, **kwargs: Any) -> Ticket:
            tickets.append(admit(*args, **kwargs))
            return tickets[-1]

        rt.router.admit = recording  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            # a's first turn holds one replica: b's first turn takes the other
            await hold_busy(nursery, rt.client, CHAT, body("astronomy", 1, tokens=400))
            reply = await rt.client.post(CHAT, json=body("botany", 1))
            assert reply.status_code == 200, reply.text
        shares: dict[str, list[float]] = {"astronomy": [], "botany": []}
        for turn in (2, 3, 4):
            for topic in ("botany", "astronomy"):  # botany first: both replicas are idle when it arrives
                reply = await rt.client.post(CHAT, json=body(topic, turn))
                assert reply.status_code == 200, reply.text
                timings = reply.json()["timings"]
                shares[topic].append(timings["cache_n"] / (timings["cache_n"] + timings["prompt_n"]))
        served = [t.dispatch.replica for t in tickets if t.dispatch is not None]
    assert len(served) == 8
    astronomy, botany = [served[0], *served[3::2]], [served[1], *served[2::2]]
    assert len(set(astronomy)) == 1 and len(set(botany)) == 1 and astronomy[0] != botany[0], served
    assert all(share >= 0.8 for share in shares["astronomy"] + shares["botany"]), shares
