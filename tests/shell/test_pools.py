"""Pools through the real router and simulated upstreams: primary first, fallback by capacity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.client import assert_openai_error, chat_body, hold_busy, stream
from tests.support.harness import running_router

MODELS = {
    "big": {"parallel": 1, "gpus": [0], "sim": {"tokens": 4000, "token_rate": 200.0}},
    "small": {"parallel": 1, "gpus": [1], "sim": {"tokens": 6, "token_rate": 200.0}},
}
POOLS = {"auto": {"members": ["big", "small"], "fallback": True, "aliases": ["chat"]}}
ROUTER = {"num_gpus": 2, "routing_queue_limit": 1}

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": chat_body("auto", max_tokens=6),
    "/v1/messages": {"model": "auto", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "auto", "max_output_tokens": 6, "input": "hi"},
}


async def _saturate_primary(rt: Any, nursery: trio.Nursery) -> None:
    """Start a long request on the primary and return once it generates."""
    await hold_busy(nursery, rt.client, "/v1/chat/completions", chat_body("big", max_tokens=4000))


async def test_members_load_at_start_and_the_primary_serves_first(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as rt:
        await rt.wait_ready("big")
        await rt.wait_ready("small")
        reply = await rt.client.post("/v1/chat/completions", json=chat_body("chat", max_tokens=3))
        assert reply.status_code == 200
        assert reply.headers["x-router-model"] == "big"
        assert reply.json()["model"] == "big"
        status = await rt.status()
        pool = status["pools"][0]
        assert [m["model"] for m in pool["members"]] == ["big", "small"]
        assert pool["members"][0]["gpus"] == [0] and pool["members"][1]["gpus"] == [1]


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_a_busy_primary_falls_back_and_the_reply_names_the_member(tmp_path: Path, path: str) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as rt:
        await rt.wait_ready("small")
        async with trio.open_nursery() as nursery:
            await _saturate_primary(rt, nursery)
            plain = await rt.client.post(path, json=BODIES[path])
            assert plain.status_code == 200, plain.text
            assert plain.headers["x-router-model"] == "small"
            doc = plain.json()
            assert doc.get("model") == "small" or doc.get("response", {}).get("model") == "small", doc
            streamed = await stream(rt.client, path, BODIES[path])
            assert streamed.status == 200
            assert streamed.headers["x-router-model"] == "small"
            docs = [json.loads(e.data) for e in streamed.events if e.data and e.data.startswith("{")]
            models = {d.get("model") for d in docs}
            models |= {d.get(key, {}).get("model") for d in docs for key in ("message", "response")}
            assert "small" in models and "big" not in models
            nursery.cancel_scope.cancel()


async def test_waiters_wake_on_release_and_a_full_routing_queue_answers_503(tmp_path: Path) -> None:
    models = {**MODELS, "small": {**MODELS["small"], "sim": {"tokens": 4000, "token_rate": 200.0}}}
    async with running_router(tmp_path, models, pools=POOLS, router=ROUTER) as rt:
        await rt.wait_ready("small")
        await rt.wait_ready("big")
        waiter: dict[str, Any] = {}
        answered = trio.Event()
        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as longs:
                await _saturate_primary(rt, longs)
                await hold_busy(longs, rt.client, "/v1/chat/completions", chat_body("small", max_tokens=4000))

                async def wait_for_room() -> None:
                    body = chat_body("auto", max_tokens=2)
                    waiter["reply"] = await rt.client.post("/v1/chat/completions", json=body)
                    waiter["at"] = trio.current_time()
                    answered.set()

                outer.start_soon(wait_for_room)
                await rt.wait_state(
                    lambda s: s.queues.get("auto") is not None and s.queues["auto"].count == 1
                )
                full = await rt.client.post("/v1/chat/completions", json=chat_body("auto", max_tokens=2))
                assert_openai_error(full, 503, "queue_full")
                assert "routing_queue_limit" in full.json()["error"]["message"]
                assert full.headers.get("retry-after")
                released = trio.current_time()
                longs.cancel_scope.cancel()  # both clients leave: their slots come back at once
            # The long streams would have held their slots 20 s more: a deadline well short of that.
            with trio.fail_after(10):
                await answered.wait()
        assert waiter["reply"].status_code == 200
        assert released < waiter["at"]  # woken by the release


async def test_token_counting_needs_a_concrete_model(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as rt:
        for path in ("/tokenize", "/v1/messages/count_tokens"):
            reply = await rt.client.post(path, json={"model": "auto", "content": "a b c", "messages": []})
            assert_openai_error(reply, 400, "pool_not_allowed")
            assert "big, small" in reply.json()["error"]["message"]


async def test_a_request_too_long_for_every_member_gets_400_with_the_numbers(tmp_path: Path) -> None:
    models = {
        "big": {**MODELS["big"], "ctx": 512},
        "small": {**MODELS["small"], "ctx": 256},
    }
    async with running_router(tmp_path, models, pools=POOLS, router=ROUTER) as rt:
        reply = await rt.client.post("/v1/chat/completions", json=chat_body("auto", max_tokens=600))
        assert_openai_error(reply, 400, "context_length_exceeded")
        message = reply.json()["error"]["message"]
        needed = int(message.split("needs ")[1].split(" tokens")[0])
        assert needed >= 600 and "is 512 tokens" in message, message
