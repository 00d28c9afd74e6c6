"""Prompt caches across swaps, against the real llama-server: a model swapped out and back finds its
conversation's prompt already computed; a different conversation gets only the tokens it really shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import RouterHandle
from tests.support.realharness import real_router
from tests.support.waiting import until

pytestmark = pytest.mark.real

SYSTEM = "You answer questions about the archive. " + " ".join(f"entry{i} is filed" for i in range(150))
MODELS = {"alpha": {}, "beta": {"shape": "other"}}  # one GPU, one model at a time


def chat(model: str, *turns: str, system: str = SYSTEM) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0.0}


async def timings(rt: RouterHandle, body: dict[str, Any]) -> tuple[int, int]:
    """(tokens taken from the cache, prompt tokens) of one request."""
    reply = await rt.client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    doc = reply.json()
    return doc["timings"]["cache_n"], doc["usage"]["prompt_tokens"]


async def kv_happenings(rt: RouterHandle) -> list[dict[str, Any]]:
    status = (await rt.client.get("/status")).json()
    return [h for h in reversed(status["recent"]) if h["kind"].startswith("kv_")]


async def kv_restores(rt: RouterHandle) -> list[dict[str, Any]]:
    return [h["kv"] for h in await kv_happenings(rt) if h["kind"] == "kv_restore"]


async def test_a_conversation_keeps_its_cache_across_a_swap(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS) as rt:
        first_cached, first_prompt = await timings(rt, chat("alpha", "Which entry is first?"))
        assert first_cached == 0 and first_prompt > 900
        await timings(rt, chat("beta", "hello"))  # alpha is evicted: its slot is saved first
        saves = [h for h in await kv_happenings(rt) if h["kind"] == "kv_save"]
        assert [(h["model"], h["kv"]["outcome"]) for h in saves] == [("alpha", "saved")]
        assert saves[0]["kv"]["tokens"] >= first_prompt
        assert list((tmp_path / "kv").glob("alpha-*/*.bin"))

        cached, prompt = await timings(rt, chat("alpha", "Which entry is first?", "entry0.", "And next?"))
        assert cached >= 0.9 * first_prompt, (cached, prompt)
        assert cached >= 0.9 * prompt - 40  # only the new turn's tokens are computed
        restores = [h for h in await kv_happenings(rt) if h["kind"] == "kv_restore"]
        assert [(h["model"], h["kv"]["outcome"]) for h in restores] == [("alpha", "restored")]


async def test_another_conversation_gets_only_the_tokens_it_shares(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS) as rt:
        secret = "The vault code is " + " ".join(f"digit{i}" for i in range(120))
        _, with_secret = await timings(rt, chat("alpha", secret))
        await timings(rt, chat("beta", "hello"))  # alpha saved with the secret in its slot
        # Same system prompt, another question: the saved state is restored (they share the system prompt)
        # but llama-server reuses only the common prefix, never the other conversation's message.
        cached, prompt = await timings(rt, chat("alpha", "What is on the shelf?"))
        restores = [h["kv"] for h in await kv_happenings(rt) if h["kind"] == "kv_restore"]
        assert [r["outcome"] for r in restores] == ["restored"]
        assert cached <= restores[0]["tokens"] < with_secret - 100, (cached, restores, with_secret)
        assert cached <= prompt - 5
        # A prompt sharing nothing is not given a saved state at all.
        await timings(rt, chat("beta", "and again"))
        cached, _ = await timings(rt, chat("alpha", "Unrelated.", system="A different assistant entirely."))
        assert cached == 0
        outcomes = [h["kv"]["outcome"] for h in await kv_happenings(rt) if h["kind"] == "kv_restore"]
        assert outcomes[-1] == "no_match"


async def test_both_slots_of_a_two_slot_model_come_back(tmp_path: Path) -> None:
    first = "You file letters. " + " ".join(f"letter{i} goes left" for i in range(90))
    second = "You sort parcels. " + " ".join(f"parcel{i} goes right" for i in range(90))
    models = {"alpha": {"parallel": 2}, "beta": {"shape": "other"}}
    async with real_router(tmp_path, models) as rt:
        _, one = await timings(rt, chat("alpha", "Where does letter3 go?", system=first))
        _, two = await timings(rt, chat("alpha", "Where does parcel3 go?", system=second))
        await timings(rt, chat("beta", "hello"))
        (save,) = [h for h in await kv_happenings(rt) if h["kind"] == "kv_save"]
        assert "2 slot(s)" in save["kv"]["detail"]
        cached, _ = await timings(rt, chat("alpha", "Where does letter3 go?", "left", "And 4?", system=first))
        assert cached >= 0.9 * one

        async def both_restored() -> list[dict[str, Any]] | None:
            restores = [h["kv"] for h in await kv_happenings(rt) if h["kind"] == "kv_restore"]
            return restores if len(restores) >= 2 else None

        # The second slot is filled once the replica serves, beside the request.
        restores = await until(both_restored, timeout=30)
        assert [(r["slot"], r["outcome"]) for r in restores] == [(0, "restored"), (1, "restored")]
        cached, _ = await timings(
            rt, chat("alpha", "Where does parcel3 go?", "right", "And 4?", system=second)
        )
        assert cached >= 0.9 * two
