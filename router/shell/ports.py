"""Picking a free TCP port for a llama-server replica."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    The port is released before returning, so another process could take it before the replica binds
    it; the caller sees that as a replica that exits at load with "couldn't bind" in its log.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
