"""Freed memory goes back to the system once a burst of requests is over.

A crowd of clients leaves the router's heap full of freed blocks (request bodies, socket buffers, replies)
that the C allocator keeps for reuse: the process stays at its peak size long after the last request.
When requests have been served since the last look and none is in flight now, ``malloc_trim`` hands the
free pages back. It is glibc's; elsewhere (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import trio

log = logging.getLogger("router")
TRIM_EVERY = 2.0  # seconds between looks


def malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)`` as a call, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


async def trim_when_idle(
    served: Callable[[], int], busy: Callable[[], bool], every: float = TRIM_EVERY
) -> None:
    """Trim after requests were served (``served``: a count that grows with them) and none is ``busy``."""
    trim = malloc_trim()
    if trim is None:
        return
    seen = served()
    while True:
        await trio.sleep(every)
        count = served()
        if count != seen and not busy():
            seen = count
            trim()
