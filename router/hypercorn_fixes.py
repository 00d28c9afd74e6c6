"""One fix to hypercorn's HTTP/1.1 protocol under Trio, applied when the router starts.

When a response ends, hypercorn tells the application the exchange is over (``http.disconnect``) and then,
on the same task, either closes the connection (``Connection: close``, HTTP/1.0) or re-arms the idle
keep-alive timer. quart-trio cancels that task as soon as it sees the disconnect, so the close or the
re-arming is cancelled half-way: a client that asked for ``Connection: close`` (or spoke HTTP/1.0, whose
bodies may be delimited by the close) never sees the connection end, and idle keep-alive connections are
never reaped. :func:`apply` runs that end-of-exchange step shielded from cancellation; it is a handful of
non-blocking socket calls (shutdown, close, timer restart), so shielding never holds anything up.
"""

from __future__ import annotations

import functools
from typing import Any

import trio
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol

_MARK = "_llama_router_shielded"


def apply() -> None:
    """Shield hypercorn's end-of-exchange handling from the application's cancellation (idempotent)."""
    original = H11Protocol.stream_send
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def stream_send(self: H11Protocol, event: Any) -> None:
        if isinstance(event, StreamClosed):
            with trio.CancelScope(shield=True):
                await original(self, event)
        else:
            await original(self, event)

    setattr(stream_send, _MARK, True)
    H11Protocol.stream_send = stream_send  # type: ignore[method-assign]
