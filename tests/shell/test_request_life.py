"""A request's life ends exactly once, whatever point its handler is cancelled at.

The handler's side of one request (admission, ``Proxy.respond`` and the relay of its body, as the API's
forwarding path runs them) is cancelled after its k-th scheduler step, for every k until it runs to its end
uncancelled: at every await point it passes. After each, the scheduler must own no request, the shell must
hold no ticket (its life ended and was let go), the replica's slot must be free for the next request, and
exactly one record must have been written for it. It runs against the simulated llama-server over real
sockets (the relay needs a replica to talk to), with the real router in this Trio run.

A test also finds every place in router/ that tells the scheduler about a request's life: only the ticket
(router/shell/ticket.py) may build those events.
"""

from __future__ import annotations

import ast
import json
from contextlib import aclosing
from pathlib import Path

import pytest
import trio

from router.http.peer_relay import PeerRelay
from router.http.proxy import Proxy
from router.http.upstream import UpstreamPool
from router.shell.ticket import Ticket
from router.shell.views import RouterView
from statemachine.state import READY, STOPPING
from tests.support import REPO
from tests.support.client import chat_body
from tests.support.harness import RouterHandle, running_router

# The scheduler's events about one request's life; only the ticket builds them.
LIFE_EVENTS = {"RequestArrived", "RequestFinished", "ClientGone", "DispatchFailed", "PeerFailed"}


class _CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` as ``task`` starts its ``k``-th step: the await it stopped at raises Cancelled."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.steps = 0
        self.task: trio.lowlevel.Task | None = None
        self.scope: trio.CancelScope | None = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task and self.scope is not None:
            self.steps += 1
            if self.steps == self.k:
                self.scope.cancel()


async def _serve_one(h: RouterHandle, proxy: Proxy, stream: bool, cut: _CancelAtStep) -> Ticket:
    """One request as the forwarding path serves it (admitted, answered, its body relayed), cancelled by
    ``cut``; its ticket."""
    cut.task = trio.lowlevel.current_task()
    body = chat_body("m", max_tokens=6, stream=stream)
    ticket = h.router.admit("m", asked="m", endpoint="/v1/chat/completions", client="t", tokens=6)
    with trio.CancelScope() as scope:
        cut.scope = scope
        reply = await proxy.respond(
            ticket,
            method="POST",
            path="/v1/chat/completions",
            query=b"",
            body=json.dumps(body).encode(),
            headers=[(b"content-type", b"application/json")],
            stream=stream,
        )
        if not isinstance(reply.body, bytes):
            async with aclosing(reply.body) as chunks:  # type: ignore[type-var]
                async for _ in chunks:
                    pass
    cut.scope = None
    return ticket


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_request_cancelled_at_any_await_point_ends_once_and_frees_its_slot(
    tmp_path: Path, stream: bool
) -> None:
    models = {"m": {"parallel": 1, "sim": {"tokens": 6}}}
    async with running_router(tmp_path, models) as h:
        records: list[object] = []
        h.router.record_listeners.append(records.append)
        pool = UpstreamPool(connect_timeout=5.0, read_timeout=30.0, write_timeout=30.0)
        view = RouterView(h.router)
        proxy = Proxy(view, pool, PeerRelay(view, h.router.peer_http, 30.0))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run_sweeper)
            k = 0
            while True:
                k += 1
                cut = _CancelAtStep(k)
                trio.lowlevel.add_instrument(cut)
                try:
                    ticket = await _serve_one(h, proxy, stream, cut)
                finally:
                    trio.lowlevel.remove_instrument(cut)
                await h.wait_idle()
                assert ticket.ended, k
                assert len(records) == k, (k, len(records))
                # A cut during the load abandons it (INV-ABANDON): that replica goes, the next k loads anew.
                state = await h.wait_state(lambda s: all(r.phase != STOPPING for r in s.replicas))
                assert all(not r.inflight and r.phase == READY for r in state.replicas), k
                if cut.steps < k:  # it ran to its end before the k-th step: every point was tried
                    break
            nursery.cancel_scope.cancel()
        # The cuts fell at every point from admission to the last relayed byte (the first during the load). A
        # whole reply passes fewer of them: its request goes out in one write, its reply comes in one read.
        assert k > (5 if stream else 3), k
        assert len({r.status for r in records}) >= 2  # some were answered, some cut short (499)


def _builds(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name in LIFE_EVENTS:
                names.add(f"{name}:{node.lineno}")
    return names


def test_only_the_ticket_tells_the_scheduler_about_a_requests_life() -> None:
    owner = REPO / "router" / "shell" / "ticket.py"
    found = {}
    for path in sorted((REPO / "router").rglob("*.py")):
        calls = _builds(ast.parse(path.read_text(encoding="utf-8")))
        if calls:
            found[str(path.relative_to(REPO))] = sorted(calls)
    assert set(found) == {str(owner.relative_to(REPO))}, found
    ends = [
        c for c in found[str(owner.relative_to(REPO))] if c.split(":")[0] in ("RequestFinished", "ClientGone")
    ]
    assert len(ends) == 2, ends  # one place (Ticket.end) tells either end, once
