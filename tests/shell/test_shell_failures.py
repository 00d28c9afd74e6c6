"""Faults through the real router: crashes, failed loads, stuck processes, and signals to the router."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from statemachine.queries import replicas_of
from tests.support.client import assert_openai_error, chat_body, post_chat, start_post, start_stream, stream
from tests.support.harness import running_router
from tests.support.routerproc import pid_alive, router_process, wait_pid_gone
from tests.support.simserver.main import SIGTERM_IGNORED
from tests.support.simtools import read_records

MANY = {"tokens": 1000}


async def test_a_crash_mid_stream_ends_the_stream_with_an_error_and_the_next_request_reloads(
    tmp_path: Path,
) -> None:
    models = {"a": {"sim": {**MANY, "crash_after_tokens": 5}}}
    async with running_router(tmp_path, models) as h:
        reply = await stream(h.client, "/v1/chat/completions", chat_body("a", max_tokens=40))
        assert reply.status == 200
        assert not reply.done
        assert 1 <= len(reply.tokens) <= 6
        assert len(reply.errors) == 1
        error = reply.errors[0]
        assert error["type"] == "server_error" and error["code"] in ("replica_failed", "replica_exited")
        assert "'a'" in error["message"]
        first = read_records(h.records_of("a"))
        assert len(first) == 1
        await h.wait_state(lambda s: not replicas_of(s, "a"))
        await wait_pid_gone(first[0]["pid"])
        exits = [x for x in h.router.happenings if x.kind == "exited" and x.model == "a"]
        assert len(exits) == 1
        assert "after it was ready" in exits[0].reason and "CUDA error" in exits[0].reason

        again = await post_chat(h.client, "a", max_tokens=3)
        assert again.status_code == 200, again.text
        assert again.json()["usage"]["completion_tokens"] == 3
        records = read_records(h.records_of("a"))
        assert len(records) == 2 and records[1]["pid"] != first[0]["pid"]


async def test_out_of_memory_at_load_rejects_every_waiter_at_once(tmp_path: Path) -> None:
    models = {"a": {"parallel": 1, "sim": {"oom_at_load": True, "load_delay": 0.2}}}
    async with running_router(tmp_path, models, router={"load_timeout": 30.0}) as h:
        # The exit is seen at once: a deadline well short of load_timeout, whose failure would say "did not
        # answer /health", not "out of memory".
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                waiters = [start_post(nursery, h.client, chat_body("a", max_tokens=2)) for _ in range(3)]
        status = await h.status()
    for waiter in waiters:
        assert waiter.response is not None
        error = assert_openai_error(waiter.response, 503, "load_failed")
        assert "out of memory" in error["message"]
        assert "cudaMalloc failed" in error["message"]
    assert status["replicas"] == []
    assert any(x["kind"] == "load_failed" and x["model"] == "a" for x in status["recent"])


async def test_a_replica_that_never_answers_health_fails_after_load_timeout(tmp_path: Path) -> None:
    models = {"a": {"sim": {"hang_health": True}}}
    async with running_router(tmp_path, models, router={"load_timeout": 1.5, "stop_timeout": 1.0}) as h:
        response = await post_chat(h.client, "a", max_tokens=2)
        error = assert_openai_error(response, 503, "load_failed")
        assert "did not answer /health within 1.5 s" in error["message"]
        await h.wait_state(lambda s: not replicas_of(s, "a"))
        (record,) = read_records(h.records_of("a"))
        await wait_pid_gone(record["pid"])


async def test_a_replica_ignoring_sigterm_is_killed_after_stop_timeout(tmp_path: Path) -> None:
    models = {"a": {"sim": {"ignore_sigterm": True}}, "b": {"sim": {}}}
    router = {"max_models_per_gpu": 1, "stop_timeout": 0.5}
    async with running_router(tmp_path, models, router=router) as h:
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        (record,) = read_records(h.records_of("a"))
        replica = replicas_of(h.router.state, "a")[0].id
        response = await post_chat(h.client, "b", max_tokens=1)
        assert response.status_code == 200
        assert not pid_alive(record["pid"])
        info = h.router.supervisor.info(replica)
        assert info is not None and info.returncode == -signal.SIGKILL  # killed ...
        assert SIGTERM_IGNORED in h.router.supervisor.logs(replica)  # ... once SIGTERM had been ignored
    kinds = [x.kind for x in h.router.happenings if x.model == "a" and x.kind in ("stop", "exited")]
    assert kinds == ["stop", "exited"]
    stop = next(x for x in h.router.happenings if x.kind == "stop" and x.model == "a")
    assert "evicted" in stop.reason


async def test_a_router_killed_with_sigkill_leaves_no_replica_behind(tmp_path: Path) -> None:
    async with router_process(tmp_path, {"a": {"sim": {}}}) as rp:
        assert (await post_chat(rp.client, "a", max_tokens=1)).status_code == 200
        status = await rp.status()
        (replica,) = status["replicas"]
        child = replica["pid"]
        assert pid_alive(child)
        os.kill(rp.pid, signal.SIGKILL)
        assert await rp.wait_exit() == -signal.SIGKILL
        await wait_pid_gone(child, timeout=5.0)


async def test_sigterm_drains_in_flight_streams_refuses_new_requests_and_exits_zero(tmp_path: Path) -> None:
    async with router_process(tmp_path, {"a": {"sim": MANY}}) as rp, trio.open_nursery() as nursery:
        running = start_stream(nursery, rp.client, chat_body("a", max_tokens=60))
        await running.first_token.wait()
        child = (await rp.status())["replicas"][0]["pid"]
        rp.signal(signal.SIGTERM)
        await rp.wait_status(lambda doc: doc["shutting_down"])
        late = await post_chat(rp.client, "a", max_tokens=1)
        assert_openai_error(late, 503, "shutting_down")
        assert "retry-after" in late.headers
        assert not running.done.is_set()
        await running.done.wait()
        assert await rp.wait_exit() == 0
        await wait_pid_gone(child)
    reply = running.stream
    assert reply.done and not reply.errors
    assert len(reply.tokens) > 60


async def test_a_crash_during_a_plain_request_answers_502(tmp_path: Path) -> None:
    models = {"a": {"sim": {**MANY, "crash_after_tokens": 3}}}
    async with running_router(tmp_path, models) as h:
        response = await post_chat(h.client, "a", max_tokens=10)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["type"] == "server_error" and "'a'" in error["message"]
        await h.wait_idle()


async def test_a_stream_waiting_for_a_load_that_fails_ends_with_an_error_event(tmp_path: Path) -> None:
    """The stream has already begun (keep-alive comments) when the load fails: the error comes as an event."""
    models = {"a": {"sim": {"oom_at_load": True, "load_delay": 1.5}}}
    async with running_router(tmp_path, models) as h:
        reply = await stream(h.client, "/v1/chat/completions", chat_body("a", max_tokens=3))
        await h.wait_idle()
    assert reply.status == 200
    assert reply.comments and not reply.tokens and not reply.done
    (error,) = reply.errors
    assert error["code"] == "load_failed" and "out of memory" in error["message"]


async def test_sigterm_stops_streams_that_outlast_shutdown_grace(tmp_path: Path) -> None:
    router = {"shutdown_grace": 0.5}
    async with (
        router_process(tmp_path, {"a": {"sim": MANY}}, router=router) as rp,
        trio.open_nursery() as nursery,
    ):
        running = start_stream(nursery, rp.client, chat_body("a", max_tokens=500))
        await running.first_token.wait()
        rp.signal(signal.SIGTERM)
        await running.done.wait()
        assert await rp.wait_exit() == 0
    reply = running.stream
    assert not reply.done and len(reply.errors) == 1
    assert reply.errors[0]["type"] == "server_error"
    assert len(reply.tokens) < 200  # cut at the grace's end, not the stream's (10 s of tokens)
