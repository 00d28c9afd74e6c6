"""The router's listening socket, bound before anything else starts so that a taken port is one clear line.

``open_sockets`` binds and listens exactly as hypercorn would (its own ``create_sockets``); the sockets are
then handed to hypercorn. A failure raises :class:`ListenError`, whose message names the address and the
setting to change.
"""

from __future__ import annotations

import errno
import socket

from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets

PORT_FIX = "set another `port` in [router] (or ROUTER_PORT)"
HOST_FIX = "set `host` in [router] (or ROUTER_HOST)"


class ListenError(Exception):
    """The router cannot listen where its configuration says; the message says what to change."""


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_problem(host: str, port: int, exc: OSError) -> str:
    where = f"cannot listen on {address(host, port)}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: the host name {host!r} does not resolve ({exc.strerror or exc}); {HOST_FIX}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: the address is already in use (another llama-router or another program listens "
            f"there); {PORT_FIX}, or another address with `host` (ROUTER_HOST)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine; {HOST_FIX} to one of its addresses"
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges); {PORT_FIX}"
    return f"{where}: {exc.strerror or exc}; {PORT_FIX}, or {HOST_FIX}"


def open_sockets(hc: HypercornConfig, host: str, port: int) -> Sockets:
    """Bind and listen on hypercorn's configured address; raise ListenError naming what to change."""
    try:
        sockets = hc.create_sockets()
        for sock in sockets.insecure_sockets:
            sock.listen(hc.backlog)
    except OSError as exc:
        raise ListenError(listen_problem(host, port, exc)) from None
    return sockets
