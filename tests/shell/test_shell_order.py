"""Order, cancellation and concurrency through the real router, read from streamed token arrival times."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.client import chat_body, max_overlap, post_chat, start_post, start_stream, stream
from tests.support.harness import inflight_of, queued_for, running_router

# Long replies come from max_tokens; the simulated models could produce up to this many tokens.
MANY = {"tokens": 1000}


async def test_order_is_kept_across_a_swap(tmp_path: Path) -> None:
    """A long stream to A, then B (needs a swap), then A again: they finish A, B, A.

    A has a free slot when the second A request arrives, but B came first and waits for the GPU, so the
    second A request must not slip in ahead of it.
    """
    router = {"max_models_per_gpu": 1, "queue_head_grace": 0.0, "queue_force_load_timeout": 600.0}
    models = {"a": {"parallel": 2, "sim": MANY}, "b": {"sim": MANY}}
    async with running_router(tmp_path, models, router=router) as h, trio.open_nursery() as nursery:
        first = start_stream(nursery, h.client, chat_body("a", max_tokens=60))
        await first.first_token.wait()
        second = start_stream(nursery, h.client, chat_body("b", max_tokens=10))
        await h.wait_state(lambda s: queued_for(s, "b") == 1)
        third = start_stream(nursery, h.client, chat_body("a", max_tokens=10))
        await h.wait_state(lambda s: queued_for(s, "a") == 1)
        # A still has a free slot here; the second A request waits behind B all the same.
        assert inflight_of(h.router.state, "a") == 1
        await third.done.wait()
        await second.done.wait()
        await first.done.wait()

    a1, b, a2 = first.stream, second.stream, third.stream
    for reply in (a1, b, a2):
        assert reply.status == 200
        assert reply.done and not reply.errors
    assert len(a1.tokens) > 60 and len(b.tokens) > 10 and len(a2.tokens) > 10
    assert a1.last_token_at < b.first_token_at
    assert b.last_token_at < a2.first_token_at
    assert a1.ended_at is not None and b.ended_at is not None and a2.ended_at is not None
    assert a1.ended_at < b.ended_at < a2.ended_at


async def test_a_client_that_leaves_frees_its_slot_at_once(tmp_path: Path) -> None:
    """Both slots of A hold long streams; one client leaves; two short requests queued behind it then
    finish long before the surviving stream does."""
    async with (
        running_router(tmp_path, {"a": {"parallel": 2, "sim": MANY}}) as h,
        trio.open_nursery() as nursery,
    ):
        leave = trio.Event()
        leaving = start_stream(nursery, h.client, chat_body("a", max_tokens=200), drop_when=leave)
        staying = start_stream(nursery, h.client, chat_body("a", max_tokens=150))
        await leaving.first_token.wait()
        await staying.first_token.wait()
        short = [start_stream(nursery, h.client, chat_body("a", max_tokens=3)) for _ in range(2)]
        await h.wait_state(lambda s: queued_for(s, "a") == 2)
        left_at = trio.current_time()
        leave.set()
        for pending in short:
            await pending.done.wait()
        await staying.done.wait()
        await leaving.done.wait()

    assert leaving.stream.dropped
    assert len(leaving.stream.tokens) < 100
    for pending in short:
        reply = pending.stream
        assert reply.status == 200 and reply.done and not reply.errors
        assert reply.first_token_at > left_at
        # The short replies ran while the long one still streamed: well before its end.
        assert sum(at > reply.last_token_at for at in staying.stream.token_times) > 50
    assert staying.stream.done and not staying.stream.errors


@pytest.mark.parametrize(("clients", "slots"), [(5, 3), (2, 3)])
async def test_as_many_streams_generate_at_once_as_there_are_slots(
    tmp_path: Path, clients: int, slots: int
) -> None:
    """N clients on a model with P slots: min(N, P) replies generate at the same instant, never more."""
    async with (
        running_router(tmp_path, {"a": {"parallel": slots, "sim": MANY}}) as h,
        trio.open_nursery() as nursery,
    ):
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        pending = [start_stream(nursery, h.client, chat_body("a", max_tokens=40)) for _ in range(clients)]
        for p in pending:
            await p.done.wait()

    replies = [p.stream for p in pending]
    for reply in replies:
        assert reply.status == 200 and reply.done and not reply.errors
    intervals = [(r.first_token_at, r.last_token_at) for r in replies]
    assert max_overlap(intervals) == min(clients, slots)
    # The first wave starts together: each of them has its first token before any reply ends.
    starts = sorted(r.first_token_at for r in replies)
    first_end = min(b for _, b in intervals)
    assert all(start < first_end for start in starts[: min(clients, slots)])
    if clients > slots:
        # Later clients begin only after someone of the first wave finished.
        assert all(start > first_end for start in starts[slots:])


async def test_queued_non_streamed_requests_keep_arrival_order(tmp_path: Path) -> None:
    """With one slot, queued requests are served in the order they arrived."""
    async with running_router(tmp_path, {"a": {"sim": MANY}}) as h, trio.open_nursery() as nursery:
        head = start_stream(nursery, h.client, chat_body("a", max_tokens=30))
        await head.first_token.wait()
        waiting = []
        for i in range(4):
            waiting.append(start_post(nursery, h.client, chat_body("a", max_tokens=2)))
            await h.wait_state(lambda s, n=i + 1: queued_for(s, "a") == n)
        for p in waiting:
            await p.done.wait()
    ends = []
    for p in waiting:
        assert p.response is not None and p.response.status_code == 200
        assert p.ended_at is not None
        ends.append(p.ended_at)
    assert ends == sorted(ends)
    assert head.stream.last_token_at < ends[0]


async def test_clients_that_leave_while_queued_are_forgotten(tmp_path: Path) -> None:
    """A streamed request (already answering with keep-alive comments) and a plain one leave the queue;
    neither reaches the replica later, and the next request goes straight to the free slot."""
    async with running_router(tmp_path, {"a": {"sim": MANY}}) as h, trio.open_nursery() as nursery:
        busy = start_stream(nursery, h.client, chat_body("a", max_tokens=100))
        await busy.first_token.wait()
        comments = trio.Event()

        async def leaving_stream(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await stream(
                    h.client,
                    "/v1/chat/completions",
                    chat_body("a", max_tokens=100),
                    on_event=lambda e: comments.set() if e.comment is not None else None,
                )

        async def leaving_post(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await post_chat(h.client, "a", max_tokens=100)

        first = await nursery.start(leaving_stream)
        second = await nursery.start(leaving_post)
        await h.wait_state(lambda s: queued_for(s, "a") == 2)
        await comments.wait()
        first.cancel()
        second.cancel()
        await h.wait_state(lambda s: queued_for(s, "a") == 0)
        assert inflight_of(h.router.state, "a") == 1
        await busy.done.wait()
        await h.wait_idle()
        # The router holds no request and the replica's one slot is free: nothing stands before the next.
        (replica,) = (await h.status())["replicas"]
        slots = (await h.client.get(f"http://127.0.0.1:{replica['port']}/slots")).json()
        assert [slot["is_processing"] for slot in slots] == [False]
        reply = await stream(h.client, "/v1/chat/completions", chat_body("a", max_tokens=2))
    assert busy.stream.done
    assert reply.done
