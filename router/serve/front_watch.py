"""One task notices every front client that leaves while its request is being answered.

The forwarding path must learn at once when a client goes away (the request leaves the queue, or its
upstream exchange closes and the slot is free). Over ASGI that takes a task per request that waits for
``http.disconnect``: a nursery, a task and its start and cancellation for every request, around a tenth of
the router's processor time per small request. For the front's own exchanges (``router.serve.front``),
:class:`LeaveWatch` does it for all of them at once: one task waits on an epoll set of its own holding the
client connection of every request being answered, and when one is readable it reads what came without
waiting (``Exchange.read_waiting``): the end of the connection cancels the request's scope; the bytes of a
next, pipelined request are kept for the front, up to ``PIPELINE_LIMIT``, past which that connection is no
longer watched (as the exchange's own ``receive`` reads no further ahead). A write that finds the client
gone (or stalled past ``send_timeout``) closes the connection, which leaves the epoll set unseen: the
exchange then cancels the scope itself (``Exchange.on_leave``).
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from router.http.relay_pump import serve_epoll
from router.serve.front_exchange import Exchange


class LeaveWatch:
    """The task that watches the front's clients; run it with ``run`` in a nursery that outlives requests."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: dict[int, tuple[Exchange, trio.CancelScope]] = {}

    def __len__(self) -> int:
        return len(self._watched)

    def __call__(
        self, receive: Callable[[], Awaitable[dict[str, Any]]], scope: trio.CancelScope
    ) -> Callable[[], None] | None:
        """Cancel ``scope`` when the client of ``receive`` (an ASGI receive) leaves; what stops the watch,
        or None when ``receive`` is not a front exchange's (its caller then waits for ``http.disconnect``).
        The request's body must have been read."""
        exchange = getattr(receive, "__self__", None)
        if not isinstance(exchange, Exchange):
            return None
        fd = exchange.fileno()
        if fd < 0 or exchange.gone:
            scope.cancel()
            return _nothing
        exchange.on_leave = scope.cancel  # a write that finds the client gone closes the connection
        if not exchange.read_ahead_full():  # else, as the exchange's own receive, read no further ahead
            try:
                self._epoll.register(fd, select.EPOLLIN)
            except FileExistsError:  # a descriptor closed while registered and reused: forgotten late
                self._epoll.modify(fd, select.EPOLLIN)
            self._watched[fd] = (exchange, scope)
        return lambda: self._drop(fd, exchange)

    def _drop(self, fd: int, exchange: Exchange) -> None:
        watched = self._watched.get(fd)
        exchange.on_leave = None
        if watched is not None and watched[0] is exchange:
            del self._watched[fd]
            with contextlib.suppress(OSError, ValueError):  # closed already: the kernel removed it
                self._epoll.unregister(fd)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await serve_epoll(self._epoll, self._ready, task_status)

    def _ready(self, fds: list[tuple[int, int]]) -> None:
        for ready, _ in fds:
            watched = self._watched.get(ready)
            if watched is None:
                continue
            exchange, scope = watched
            left = exchange.read_waiting()
            if left is None:
                continue
            self._drop(ready, exchange)
            if left:
                scope.cancel()


def _nothing() -> None:
    return None
