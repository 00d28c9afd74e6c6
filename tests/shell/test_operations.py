"""Running for months: API keys, idle unload, load on startup, draining shutdown with waiters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.support.client import SseEvent, assert_openai_error, chat_body, post_chat, stream
from tests.support.harness import running_router

KEYS = {"api_keys": ["sk-one", "sk-two"]}


async def test_api_keys_guard_everything_but_health_and_the_dashboard_page(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {}}, router=KEYS) as rt:
        assert (await rt.client.get("/health")).status_code == 200
        assert (await rt.client.get("/dash")).status_code == 200
        for path in ("/v1/models", "/status", "/metrics", "/history"):
            error = assert_openai_error(await rt.client.get(path), 401, "invalid_api_key")
            assert "Authorization: Bearer" in error["message"]
        assert_openai_error(await post_chat(rt.client, "a"), 401, "invalid_api_key")
        wrong = {"Authorization": "Bearer sk-three"}
        assert_openai_error(await rt.client.get("/v1/models", headers=wrong), 401, "invalid_api_key")
        assert (
            await rt.client.get("/v1/models", headers={"Authorization": "Bearer sk-two"})
        ).status_code == 200
        reply = await rt.client.post(
            "/v1/chat/completions", json=chat_body("a", max_tokens=2), headers={"x-api-key": "sk-one"}
        )
        assert reply.status_code == 200


async def test_idle_models_unload_after_their_ttl_and_startup_models_load_at_once(tmp_path: Path) -> None:
    models: dict[str, Any] = {"a": {"ttl": 0.5, "gpus": [0]}, "warm": {"load_on_startup": True, "gpus": [1]}}
    async with running_router(tmp_path, models, router={"num_gpus": 2}) as rt:
        await rt.wait_ready("warm")
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200
        # When: the owner tier keeps the ttl on a mock clock (tests/owner/test_owner_timing.py); here, why.
        await rt.wait_state(lambda s: not any(r.model == "a" for r in s.replicas), timeout=5)
        status = await rt.status()
        assert any(h["model"] == "a" and "ttl" in h["reason"] for h in status["recent"])
        assert [r["model"] for r in status["replicas"]] == ["warm"]


async def test_shutdown_finishes_streams_and_answers_waiters_503(tmp_path: Path) -> None:
    models = {"a": {"parallel": 1, "sim": {"tokens": 60, "token_rate": 100.0}}}
    async with running_router(tmp_path, models) as rt:
        results: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            first = trio.Event()

            def seen(event: SseEvent) -> None:
                if event.data is not None:  # a token, not a comment sent while the model loads
                    first.set()

            async def long() -> None:
                body = chat_body("a")
                results["stream"] = await stream(rt.client, "/v1/chat/completions", body, on_event=seen)

            async def waiter() -> None:
                results["waiter"] = await post_chat(rt.client, "a", max_tokens=2)

            nursery.start_soon(long)
            await first.wait()
            nursery.start_soon(waiter)
            await rt.wait_state(lambda s: s.waiting == 1)
            nursery.start_soon(rt.router.shutdown, 10.0)
        assert results["stream"].done
        assert_openai_error(results["waiter"], 503, "shutting_down")
        assert results["waiter"].headers.get("retry-after")
