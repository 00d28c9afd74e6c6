"""What the kernel holds for one TCP connection on this machine, read from Linux's /proc/net/tcp and
/proc/net/tcp6: a test sees that a peer has read what it was sent, or that a reader's window is shut,
instead of sleeping for it."""

from __future__ import annotations

from pathlib import Path

import attrs


@attrs.frozen
class Queues:
    """``unacked``: bytes sent on this end that the other end's kernel has not taken yet (``tx_queue``);
    ``unread``: bytes received on this end that its program has not read yet (``rx_queue``)."""

    unacked: int
    unread: int


def queues(local_port: int, remote_port: int) -> Queues | None:
    """The queues of the connection from ``local_port`` to ``remote_port`` (both on this machine, seen from
    the ``local_port`` end), or None when there is no such connection (not yet, or no more)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
            if (local, remote) == (local_port, remote_port):
                tx, rx = (int(n, 16) for n in fields[4].split(":"))
                return Queues(tx, rx)
    return None
