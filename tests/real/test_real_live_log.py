"""A real llama-server's output followed through ``/logs/{replica}?follow=1`` as it writes it, until it exits;
and its /v1/models entry with its context, load status and capabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from statemachine.queries import replicas_of
from tests.support.client import post_chat
from tests.support.realharness import real_router
from tests.support.waiting import until

pytestmark = pytest.mark.real


async def test_a_real_replicas_new_lines_are_followed_until_it_exits(tmp_path: Path) -> None:
    async with real_router(tmp_path, {"tiny": {"ctx": 512, "parallel": 2, "aliases": ["t"]}}) as h:
        assert (await post_chat(h.client, "tiny", max_tokens=2)).status_code == 200
        [replica] = [r.id for r in replicas_of(h.router.state, "tiny")]
        entries = {m["id"]: m for m in (await h.models())["data"]}
        text = ""
        ended = trio.Event()

        async def read(task_status: trio.TaskStatus[None]) -> None:
            nonlocal text
            params = {"follow": "1", "lines": "0"}
            async with h.client.stream("GET", f"/logs/{replica}", params=params) as reply:
                assert reply.status_code == 200
                task_status.started()
                async for chunk in reply.aiter_text():
                    text += chunk
            ended.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(read)
            file = h.router.supervisor.log_file(replica)
            assert file is not None
            await until(lambda: file.feed.followers == 1, what="the follower")
            assert text == ""  # no tail asked for
            assert (await post_chat(h.client, "t", max_tokens=2)).status_code == 200
            await until(lambda: text.count("\n") >= 1, what="the request's lines", timeout=30)
            assert (await h.client.post("/unload", json={"model": "tiny"})).status_code == 200
            with trio.fail_after(30):
                await ended.wait()
    lines = text.splitlines()
    assert "exited (" in lines[-1]
    tiny, alias = entries["tiny"], entries["t"]
    assert tiny["context_length"] == tiny["ctx_per_slot"] == 256
    assert tiny["status"] == {"value": "loaded"} and tiny["capabilities"] == ["chat", "completion", "tools"]
    assert alias["alias_of"] == "tiny" and "slots" not in alias
