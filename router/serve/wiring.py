"""Wiring: every long-lived object of a running router, built once and connected here — the observers, the
pool of connections to replicas, the one proxy, the quart app with its routes, and the data path in front
of it. Nothing else builds them; handlers and observers get from here the narrow view of the router they
use (``router.shell.views``), never the router itself."""

from __future__ import annotations

import attrs
import httpx
import trio
from quart_trio import QuartTrio

from router.config.load import Config
from router.http.app import create_app
from router.http.dash import register_dash
from router.http.forward import DataPath, Forwarder
from router.http.peer_relay import PeerRelay
from router.http.proxy import Proxy
from router.http.relay_pump import RelayPump
from router.http.upstream import UpstreamPool
from router.observe.observers import Observers, start_observers
from router.serve.client_writer import client_writer
from router.serve.front_watch import LeaveWatch
from router.shell.runtime import Router
from router.shell.views import Admin, Desk, RouterView

UPSTREAM_CONNECT_TIMEOUT = 10.0
UPSTREAM_WRITE_TIMEOUT = 60.0


@attrs.define(eq=False)
class Wired:
    """What serves one router: the app behind the data path, and the parts they share."""

    observers: Observers
    pool: UpstreamPool
    proxy: Proxy
    app: QuartTrio
    data_path: DataPath


def replica_client(config: Config) -> httpx.AsyncClient:
    """The client for the replicas' own endpoints (their /metrics, token counts). It keeps no idle
    connection: llama-server waits about 0.1 s for each one before it exits when it is stopped."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    timeout = httpx.Timeout(connect=10.0, read=config.router.reply_timeout, write=60.0, pool=None)
    return httpx.AsyncClient(limits=limits, timeout=timeout)


async def wire(nursery: trio.Nursery, config: Config, router: Router, client: httpx.AsyncClient) -> Wired:
    """Build and start everything around ``router`` in ``nursery``: the observers first (so they see every
    request), then the router's own tasks, the pool's sweeper, and the app."""
    observers = await start_observers(nursery, config, router, client)
    await nursery.start(router.run)
    pool = UpstreamPool(
        connect_timeout=UPSTREAM_CONNECT_TIMEOUT,
        read_timeout=config.router.reply_timeout,
        write_timeout=UPSTREAM_WRITE_TIMEOUT,
    )
    nursery.start_soon(pool.run_sweeper)
    nursery.start_soon(pool.run_spares)
    router.stop_listeners.append(pool.forget_port)
    admin = Admin(router)  # the narrowest view each part needs: Admin > Desk > RouterView
    peers = PeerRelay(RouterView(router), router.peer_http, config.router.reply_timeout)
    pump = RelayPump()
    await nursery.start(pump.run)
    proxy = Proxy(RouterView(router), pool, peers, pump)
    app = create_app(config, admin, proxy)
    register_dash(app, config, Desk(router), observers, proxy)
    leave_watch = LeaveWatch()
    await nursery.start(leave_watch.run)
    forwarder = Forwarder(
        config, Desk(router), proxy, client, writer_for=client_writer, leave_watch=leave_watch
    )
    data_path = DataPath(app, forwarder)
    return Wired(observers, pool, proxy, app, data_path)
