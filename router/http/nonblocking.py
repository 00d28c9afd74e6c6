"""One write to a socket without a pass through Trio's run loop.

Trio's ``send_all`` yields once even when the kernel takes every byte at once: a second pass through the
run loop, which on the forwarding path costs more than the write itself. Callers write what the kernel
takes now and leave only the rest to a waiting ``send_all``.
"""

from __future__ import annotations

import os

import trio


def write_now_to(sock: trio.socket.SocketType, data: bytes) -> bytes:
    """What is left of ``data`` after one non-blocking write to ``sock`` (all of it when the write would
    block or the socket is broken or closed: the waiting write that follows finds out which and answers for
    it)."""
    try:
        sent = os.write(sock.fileno(), data)  # a closed socket's number is -1, which os.write refuses
    except OSError:
        return data
    return data[sent:]
