"""``GET /logs/{replica}?follow=1``: the tail, then each new line of the replica as it comes (as text, or as
server-sent events for a client that asks for them), ending when the replica exits; a reader that leaves
stops following at once, and one that does not keep up is told what it missed instead of holding memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from router.shell.logring import LineFeed
from router.shell.replica_logs import ReplicaLogFile
from statemachine.queries import replicas_of
from tests.support.client import assert_openai_error, chat_body, post_chat, start_post
from tests.support.harness import RouterHandle, running_router
from tests.support.waiting import until


@attrs.define(eq=False)
class Followed:
    """A follow request read in the background: its response and the lines (or raw text) seen so far."""

    response: httpx.Response | None = None
    lines: list[str] = attrs.field(factory=list)
    text: str = ""
    ended: trio.Event = attrs.field(factory=trio.Event)

    def has(self, fragment: str) -> bool:
        return any(fragment in line for line in self.lines)


@asynccontextmanager
async def follow(
    h: RouterHandle, replica: int, headers: dict[str, str] | None = None, **params: Any
) -> AsyncIterator[Followed]:
    """Follow ``replica``'s log until the block ends (the request is then closed, as a client that leaves)."""
    seen = Followed()
    query = {"follow": "1", **params}

    async def read(task_status: trio.TaskStatus[None]) -> None:
        async with h.client.stream("GET", f"/logs/{replica}", params=query, headers=headers or {}) as reply:
            seen.response = reply
            task_status.started()
            async for chunk in reply.aiter_text():
                seen.text += chunk
                seen.lines = seen.text.splitlines()
        seen.ended.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(read)
        yield seen
        nursery.cancel_scope.cancel()


def log_file(h: RouterHandle, replica: int) -> ReplicaLogFile:
    file = h.router.supervisor.log_file(replica)
    assert file is not None
    return file


async def ready_replica(h: RouterHandle, model: str) -> int:
    """A replica of ``model`` that has served one request, whose output lines have all been read (the
    router reads a replica's output in batches, a moment after it is printed)."""
    assert (await post_chat(h.client, model, max_tokens=2)).status_code == 200
    [replica] = [r.id for r in replicas_of(h.router.state, model)]
    await until(
        lambda: any("release" in line for line in h.router.supervisor.logs(replica)),
        what="the first request's lines",
    )
    return replica


async def test_the_tail_then_new_lines_as_they_come_until_the_replica_exits(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"alpha": {}}) as h:
        replica = await ready_replica(h, "alpha")
        tail = (await h.client.get(f"/logs/{replica}", params={"lines": 2})).text.splitlines()
        async with follow(h, replica, lines=2) as seen:
            assert seen.response is not None and seen.response.status_code == 200
            assert seen.response.headers["content-type"].startswith("text/plain")
            await until(lambda: len(seen.lines) >= 2, what="the tail")
            assert seen.lines[:2] == tail
            assert not seen.has("launch_slot_")
            # A request now: its lines reach the follower while the replica runs.
            assert (await post_chat(h.client, "alpha", max_tokens=2)).status_code == 200
            await until(lambda: seen.has("launch_slot_") and seen.has("release"), what="the new lines")
            assert log_file(h, replica).feed.followers == 1
            assert not seen.ended.is_set()
            unloaded = await h.client.post("/unload", json={"model": "alpha"})
            assert unloaded.status_code == 200
            with trio.fail_after(10):
                await seen.ended.wait()
        assert log_file(h, replica).feed.followers == 0
    assert "exited (" in seen.lines[-1] and "stopped" in seen.lines[-1]
    assert sum(1 for line in seen.lines if "launch_slot_" in line) == 1  # each line once


async def test_lines_zero_sends_no_tail_and_a_gone_replica_ends_at_once(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"alpha": {}}) as h:
        replica = await ready_replica(h, "alpha")
        async with follow(h, replica, lines=0) as seen:
            await until(lambda: log_file(h, replica).feed.followers == 1, what="a follower")
            assert seen.lines == []
            assert (await post_chat(h.client, "alpha", max_tokens=2)).status_code == 200
            await until(lambda: seen.has("launch_slot_"), what="the request's lines")
            assert not any("load_model" in line for line in seen.lines)  # none of the tail
        assert (await h.client.post("/unload", json={"model": "alpha"})).status_code == 200
        # The replica has exited: following it sends its tail, whose last line says so, and ends.
        async with follow(h, replica, lines=3) as after:
            with trio.fail_after(10):
                await after.ended.wait()
        assert_openai_error(await h.client.get("/logs/999", params={"follow": "1"}), 404, "replica_not_found")
    assert len(after.lines) == 3 and "exited (" in after.lines[-1]


async def test_a_follower_that_leaves_is_dropped_at_once(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"alpha": {}}) as h:
        replica = await ready_replica(h, "alpha")
        feed = log_file(h, replica).feed
        async with follow(h, replica, lines=1), follow(h, replica, lines=1) as second:
            await until(lambda: feed.followers == 2, what="two followers")
            await until(lambda: len(second.lines) == 1, what="the tail")
        # Both requests closed by their clients while the replica still runs: nobody follows any more.
        await until(lambda: feed.followers == 0, what="the followers dropped")
        assert [r.phase for r in replicas_of(h.router.state, "alpha")] == ["ready"]


async def test_an_event_stream_sends_one_event_a_line_and_a_last_end_event(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"alpha": {}}) as h:
        replica = await ready_replica(h, "alpha")
        events = {"Accept": "text/event-stream"}
        async with follow(h, replica, headers=events, lines=1) as seen:
            assert seen.response is not None
            assert seen.response.headers["content-type"].startswith("text/event-stream")
            assert seen.response.headers["cache-control"] == "no-cache"
            await until(lambda: seen.text.endswith("\n\n"), what="the first event")
            assert (await post_chat(h.client, "alpha", max_tokens=2)).status_code == 200
            await until(lambda: "launch_slot_" in seen.text, what="the request's line")
            assert (await h.client.post("/unload", json={"model": "alpha"})).status_code == 200
            with trio.fail_after(10):
                await seen.ended.wait()
    blocks = seen.text.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "event: end\ndata: "
    data = [block for block in blocks[:-2] if not block.startswith(":")]
    assert all(block.startswith("data: ") and "\n" not in block for block in data), data
    assert any("launch_slot_" in block for block in data) and "exited (" in data[-1]


async def test_a_loading_replicas_lines_arrive_while_it_loads(tmp_path: Path) -> None:
    slow = {"slow": {"sim": {"load_delay": 3.0}}}
    async with running_router(tmp_path, slow) as h, trio.open_nursery() as nursery:
        pending = start_post(nursery, h.client, chat_body("slow", max_tokens=2))
        state = await h.wait_state(lambda s: any(r.phase == "loading" for r in replicas_of(s, "slow")))
        [replica] = [r.id for r in replicas_of(state, "slow")]
        async with follow(h, replica) as seen:
            await until(lambda: seen.has("load_model: loading model"), what="the load's first line")
            # Seen while the replica still loads (the simulator takes seconds to load).
            assert [r.phase for r in replicas_of(h.router.state, "slow")] == ["loading"]
            assert not seen.has("model loaded")
            await until(lambda: seen.has("main: model loaded"), what="the end of the load")
        await pending.done.wait()
    assert seen.lines[0].startswith("--- ") and "replica" in seen.lines[0]  # the router's own first line


async def test_without_a_log_file_the_lines_kept_in_memory_are_sent_and_the_stream_ends(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    async with running_router(tmp_path, {"alpha": {}}, router={"replica_logs": str(blocker / "l")}) as h:
        replica = await ready_replica(h, "alpha")
        async with follow(h, replica) as seen:
            with trio.fail_after(10):
                await seen.ended.wait()
    assert any("load_tensors:" in line for line in seen.lines)
    assert "has no log file" in seen.lines[-1]


# ------------------------------------------------------------------------------------------ the feed


async def test_a_follower_that_does_not_keep_up_is_told_how_many_lines_it_missed() -> None:
    feed = LineFeed()
    with feed.follow(backlog=3) as follower:
        for i in range(10):
            feed.publish(f"line {i}")
        assert await follower.next_lines() == [
            "line 0",
            "line 1",
            "line 2",
            "--- 7 lines skipped here: " + SKIP,
        ]
        feed.publish("line 10")
        for i in range(11, 15):
            feed.publish(f"line {i}")
        assert await follower.next_lines() == [
            "line 10",
            "line 11",
            "line 12",
            "--- 2 lines skipped here: " + SKIP,
        ]
        feed.close()
        assert await follower.next_lines() is None
    assert feed.followers == 0


SKIP = "this reader did not keep up"


async def test_a_follower_waits_for_the_next_line_and_ends_with_the_feed() -> None:
    feed = LineFeed()
    got: list[list[str] | None] = []
    with feed.follow() as follower:
        async with trio.open_nursery() as nursery:

            async def take() -> None:
                got.append(await follower.next_lines())
                got.append(await follower.next_lines())

            nursery.start_soon(take)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            feed.publish("one")
            await trio.testing.wait_all_tasks_blocked()
            assert got == [["one"]]
            feed.close()
        assert got == [["one"], None]
        assert await follower.next_lines(timeout=0) is None
    with feed.follow() as late:  # following a closed feed ends at once
        assert await late.next_lines() is None
    quiet = LineFeed()
    with quiet.follow() as follower:
        assert await follower.next_lines(timeout=0) == []
