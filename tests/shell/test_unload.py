"""POST /unload answers once the replicas it stopped have exited, whatever traffic comes after it."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.support.client import chat_body, post_chat, start_stream
from tests.support.harness import running_router
from tests.support.waiting import until


async def test_unload_under_traffic_returns_once_its_replicas_have_exited(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {"parallel": 2}}) as h:
        assert (await post_chat(h.client, "m", max_tokens=1)).status_code == 200
        (first,) = [r["id"] for r in (await h.status())["replicas"]]
        answers: list[int] = []
        stop = trio.Event()

        async def traffic() -> None:  # a client that keeps asking for the model, loading it again and again
            while not stop.is_set():
                answers.append((await post_chat(h.client, "m", max_tokens=2)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(traffic)
            nursery.start_soon(traffic)
            await until(lambda: len(answers) >= 2, what="traffic flowing")
            with trio.fail_after(15):
                reply = await h.client.post("/unload", json={"model": "m"})
            stop.set()
        doc = reply.json()
        assert reply.status_code == 200 and doc["replicas"] == [first] and doc["waited"] is True
        assert set(answers) == {200}
        assert all(r.id != first for r in h.router.state.replicas)


async def test_unload_without_waiting_and_forced(tmp_path: Path) -> None:
    models = {"m": {"sim": {"tokens": 2000, "token_rate": 50.0}}}
    async with running_router(tmp_path, models) as h, trio.open_nursery() as nursery:
        long = start_stream(nursery, h.client, chat_body("m", max_tokens=2000, stream=True))
        await long.first_token.wait()
        with trio.fail_after(10):
            reply = await h.client.post("/unload", json={"model": "m", "wait": False})
        assert reply.json()["waited"] is False and len(reply.json()["replicas"]) == 1
        # Answered while the stream (about 40 s of tokens) still runs: nothing waited for it; and,
        # unforced, the busy replica drains.
        assert not long.done.is_set()
        with trio.fail_after(10):
            forced = await h.client.post("/unload", json={"force": True})
        assert forced.status_code == 200 and forced.json()["forced"] is True
        with trio.fail_after(10):
            await long.done.wait()
        assert not h.router.state.replicas
