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


async def test_with_the_default_hang_timeout_a_request_sent_to_a_frozen_replica_goes_to_its_replacement(
    tmp_path: Path,
) -> None:
    """Two slots: a stream runs on one when the replica stops; a request sent then takes the other slot of
    the stopped replica, gets nothing, and is answered by the replacement once the router has killed the
    stopped one (hang_timeout's default); only the stream that had begun ends with an error."""
    models = {"m": {"parallel": 2, "sim": {"tokens": 2000, "token_rate": 100.0}}}
    async with running_router(tmp_path, models) as h, trio.open_nursery() as nursery:
        victim = start_stream(nursery, h.client, chat_body("m", max_tokens=2000, stream=True))
        with trio.fail_after(30):
            await victim.first_token.wait()
        (replica,) = (await h.status())["replicas"]
        os.kill(replica["pid"], signal.SIGSTOP)
        late = await post_chat(h.client, "m", max_tokens=3)
        with trio.fail_after(30):
            await victim.done.wait()
        status = await h.status()
    assert late.status_code == 200, late.text
    assert "not responding" in victim.stream.errors[-1]["message"]
    (unresponsive,) = [x for x in h.router.happenings if x.kind == "unresponsive"]
    assert f"hang_timeout = {h.config.router.hang_timeout:g}" in unresponsive.reason
    assert h.config.router.hang_timeout < 5  # the default: no new work for a frozen replica after 5 s
    (replacement,) = status["replicas"]
    assert replacement["state"] == "ready" and replacement["pid"] != replica["pid"]


async def test_a_prefill_longer_than_hang_timeout_is_no_hang(tmp_path: Path) -> None:
    """The replica works on a long prompt and sends nothing for longer than hang_timeout, but its /health
    answers meanwhile: it is not killed and the request is answered."""
    models = {"m": {"sim": {"prompt_rate": 10.0, "tokens": 2}}}
    async with running_router(tmp_path, models, router={"hang_timeout": 1.0}) as h:
        reply = await post_chat(h.client, "m", text=" ".join(["word"] * 30), max_tokens=2)
    assert reply.status_code == 200, reply.text
    prompt_ms = reply.json()["timings"]["prompt_ms"]  # the replica's own account of its work on the prompt
    assert prompt_ms > 2000 * h.config.router.hang_timeout, prompt_ms
    assert not [x for x in h.router.happenings if x.kind == "unresponsive"]


@pytest.mark.real
async def test_a_long_request_on_the_real_llama_server_is_no_hang(tmp_path: Path) -> None:
    """Generation that keeps the replica busy for several hang_timeouts: /health answers, none is killed."""
    async with real_router(tmp_path, {"a": {"ctx": 4096}}, router={"hang_timeout": 0.25}) as h:
        reply = await h.client.post("/v1/chat/completions", json=long_body("a", 1800))
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 1800
    busy_ms = reply.json()["timings"]["predicted_ms"]  # llama-server's own account of the generation
    assert busy_ms > 4 * 250, busy_ms
    assert not [x for x in h.router.happenings if x.kind == "unresponsive"]
