"""A replica that stops making progress (SIGSTOP stands in for a driver hang) is found, killed and replaced.

Its streams end with an error event instead of hanging, a request waiting for it is served by the
replacement, and the scheduler learns of it through ``ReplicaUnresponsive``. Against the real llama-server
and against the simulator.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.client import chat_body, post_chat, start_stream
from tests.support.harness import RouterHandle, running_router
from tests.support.realharness import long_body, real_router


async def hang_mid_stream(h: RouterHandle, body: dict[str, Any], hang_timeout: float) -> None:
    async with trio.open_nursery() as nursery:
        victim = start_stream(nursery, h.client, body)
        with trio.fail_after(60):
            await victim.first_token.wait()
        (replica,) = (await h.status())["replicas"]
        os.kill(replica["pid"], signal.SIGSTOP)
        waiter = start_stream(nursery, h.client, {**body, "max_tokens": 4})
        with trio.fail_after(hang_timeout + 30):
            await victim.done.wait()
        with trio.fail_after(60):
            await waiter.done.wait()
    reply = victim.stream
    assert reply.errors and "not responding" in reply.errors[-1]["message"], reply.errors
    assert waiter.stream.status == 200 and waiter.stream.done, waiter.stream.body[:300]
    unresponsive = [x for x in h.router.happenings if x.kind == "unresponsive"]
    assert len(unresponsive) == 1 and f"hang_timeout = {hang_timeout:g}" in unresponsive[0].reason
    status = await h.status()
    assert [r["state"] for r in status["replicas"]] == ["ready"] and status["replicas"][0]["pid"] != replica[
        "pid"
    ]
    assert (await post_chat(h.client, body["model"], max_tokens=2)).status_code == 200


async def test_a_stopped_simulated_replica_is_replaced(tmp_path: Path) -> None:
    models = {"m": {"sim": {"tokens": 2000, "token_rate": 100.0}}}
    async with running_router(tmp_path, models, router={"hang_timeout": 1.0}) as h:
        await hang_mid_stream(h, chat_body("m", max_tokens=2000, stream=True), 1.0)


@pytest.mark.real
async def test_a_stopped_llama_server_is_replaced(tmp_path: Path) -> None:
    async with real_router(tmp_path, {"a": {"ctx": 4096}}, router={"hang_timeout": 2.0}) as h:
        await hang_mid_stream(h, {**long_body("a", 3000), "stream": True}, 2.0)


async def test_a_reply_that_stalls_past_reply_timeout_ends_with_an_error(tmp_path: Path) -> None:
    """A replica that is alive (it answers /health) but sends nothing: the exchange ends, not the replica."""
    models = {"m": {"sim": {"prompt_rate": 2.0}}}  # 2 prompt tokens a second: many seconds before a byte
    async with running_router(tmp_path, models, router={"reply_timeout": 1.0}) as h:
        reply = await post_chat(h.client, "m", max_tokens=2)
        assert reply.status_code == 502
        assert "sent nothing for 1 s (reply_timeout)" in reply.json()["error"]["message"]
        assert [r["state"] for r in (await h.status())["replicas"]] == ["ready"]
