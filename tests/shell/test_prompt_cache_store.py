"""Saved prompt caches through the router and the simulated llama-server: saved on a swap, restored on
return, bounded in time, and a save or restore that fails only means a cold start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.support.harness import RouterHandle, running_router
from tests.support.waiting import until

CONVERSATION = [
    {"role": "system", "content": "You keep the records. " + " ".join(f"record{i}" for i in range(200))},
    {"role": "user", "content": "Which record is first?"},
]


def chat(model: str, messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"model": model, "messages": messages or CONVERSATION, "max_tokens": 4}


async def ask(h: RouterHandle, model: str, messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    reply = await h.client.post("/v1/chat/completions", json=chat(model, messages))
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def kv_events(h: RouterHandle, kind: str) -> list[dict[str, Any]]:
    status = await h.status()
    return [x for x in reversed(status["recent"]) if x["kind"] == kind]


async def test_a_swapped_out_model_comes_back_with_its_conversation_cached(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {}, "b": {}}) as h:
        first = await ask(h, "a")
        assert first["timings"]["cache_n"] == 0
        await ask(h, "b")  # one model per GPU: a is evicted, its slot saved first
        (save,) = await kv_events(h, "kv_save")
        assert save["model"] == "a" and save["kv"]["outcome"] == "saved" and save["kv"]["tokens"] > 200
        (shelf,) = (tmp_path / "kv").glob("a-*")
        assert sorted(p.suffix for p in shelf.iterdir()) == [".bin", ".tokens"]
        stop = next(x for x in await kv_events(h, "stop") if x["model"] == "a")
        exited = next(x for x in await kv_events(h, "exited") if x["model"] == "a")
        assert stop["at"] <= save["at"] <= exited["at"]

        back = await ask(h, "a", [*CONVERSATION, {"role": "assistant", "content": "record0"}])
        (restore,) = await kv_events(h, "kv_restore")
        assert restore["model"] == "a" and restore["kv"]["outcome"] == "restored"
        assert back["timings"]["cache_n"] >= save["kv"]["tokens"] - 8
        metrics = (await h.client.get("/metrics")).text
        assert 'llama_router_kv_saves_total{model="a",outcome="saved"} 1.0' in metrics
        assert 'llama_router_kv_restores_total{model="a",outcome="restored"} 1.0' in metrics
        restored = restore["kv"]["tokens"]
        assert f'llama_router_kv_restored_tokens_total{{model="a"}} {float(restored)}' in metrics
        (stored,) = [line for line in metrics.splitlines() if line.startswith("llama_router_kv_store_bytes ")]
        assert float(stored.split()[1]) == sum(p.stat().st_size for p in (tmp_path / "kv").rglob("*.*"))


async def test_a_slow_save_is_abandoned_at_the_limit_and_the_swap_goes_on(tmp_path: Path) -> None:
    models = {"a": {"sim": {"slot_save_delay": 60.0}}, "b": {}}
    async with running_router(tmp_path, models, router={"kv_store_timeout": 0.5}) as h:
        await ask(h, "a")
        with trio.fail_after(20):  # a guard against a hang, not a measurement
            await ask(h, "b")
        (save,) = await kv_events(h, "kv_save")
        assert save["kv"]["outcome"] == "timeout" and "0.5 s" in save["reason"]
        # Nothing usable was kept: a comes back cold, and answers.
        back = await ask(h, "a")
        assert back["timings"]["cache_n"] == 0
        assert [x["kv"]["outcome"] for x in await kv_events(h, "kv_restore")] == []


async def test_an_unreadable_saved_state_means_a_cold_start(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {}, "b": {}}) as h:
        await ask(h, "a")
        await ask(h, "b")
        (shelf,) = (tmp_path / "kv").glob("a-*")
        (state,) = shelf.glob("*.bin")
        state.write_bytes(b"not a state")
        back = await ask(h, "a")
        assert back["timings"]["cache_n"] == 0
        (restore,) = await kv_events(h, "kv_restore")
        assert restore["kv"]["outcome"] == "failed" and "invalid slot save file" in restore["reason"]


async def test_a_model_that_opts_out_keeps_nothing(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"kv_store": False}, "b": {}}) as h:
        await ask(h, "a")
        await ask(h, "b")
        await ask(h, "a")
        events = await kv_events(h, "kv_save") + await kv_events(h, "kv_restore")
        assert {x["model"] for x in events} == {"b"}  # b, evicted by a's return, kept its cache
        assert not any((tmp_path / "kv").glob("a-*"))


async def test_a_model_with_several_slots_gets_its_other_conversations_back_too(tmp_path: Path) -> None:
    other = [
        {"role": "system", "content": "You sort the letters. " + " ".join(f"letter{i}" for i in range(200))},
        {"role": "user", "content": "Which letter is last?"},
    ]
    async with running_router(tmp_path, {"a": {"parallel": 2}, "b": {}}) as h:
        await ask(h, "a")
        await ask(h, "a", other)  # the second conversation takes a's other slot
        await ask(h, "b")
        (save,) = await kv_events(h, "kv_save")
        assert save["kv"]["outcome"] == "saved" and "2 slot(s)" in save["kv"]["detail"]
        await ask(h, "a", [*CONVERSATION, {"role": "assistant", "content": "record0"}])

        async def restored() -> list[dict[str, Any]] | None:
            events = await kv_events(h, "kv_restore")
            return events if len(events) >= 2 else None

        first, second = await until(restored, what="two kv_restore happenings")
        assert (first["kv"]["slot"], second["kv"]["slot"]) == (0, 1)
        assert second["kv"]["outcome"] == "restored" and "into slot 1" in second["reason"]
        back = await ask(h, "a", [*other, {"role": "assistant", "content": "letter199"}])
        assert back["timings"]["cache_n"] > 200  # the second conversation found its state in slot 1
