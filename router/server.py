"""Start the whole router: config → placement → scheduler + supervisor → HTTP server; drain on SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable

import httpx
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from .app import create_app
from .config import Config
from .dash import register_dash, start_observers
from .deploy import prepare
from .reload import reload_config
from .request_headers import HEADERS_LIMIT
from .runtime import Router

log = logging.getLogger("router")


def hypercorn_config(config: Config) -> HypercornConfig:
    hc = HypercornConfig()
    hc.bind = [f"{config.router.host}:{config.router.port}"]
    hc.accesslog = None
    hc.keep_alive_timeout = 75
    # The router drains in-flight work itself before it stops the HTTP server, so the server's own grace
    # only has to flush the last bytes. Idle keep-alive connections are not closed by hypercorn when it
    # stops (its idle watcher is not re-armed after a response), so a long grace delays every exit.
    hc.graceful_timeout = 1.0
    hc.h11_max_incomplete_size = HEADERS_LIMIT
    hc.read_timeout = 300
    return hc


def build_router(config: Config) -> Router:
    return Router(prepare(config))


async def run_server(
    config: Config, *, on_ready: Callable[[str], None] | None = None, router: Router | None = None
) -> None:
    router = router or build_router(config)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client, trio.open_nursery() as nursery:
        observers = await start_observers(nursery, config, router, client)
        await nursery.start(router.run)
        app = create_app(config, router, client)
        register_dash(app, config, router, observers, client)
        http_done = trio.Event()

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for sig in signals:
                    name = signal.Signals(sig).name
                    log.info("%s: draining (up to %.0f s), then stopping", name, config.router.shutdown_grace)
                    nursery.start_soon(stop)
                    break
                first = trio.current_time()
                async for _ in signals:
                    if trio.current_time() - first > 1.0:  # a repeat within a second is the same request
                        log.warning("second signal: stopping now")
                        router.submit_shutdown_now()

        async def stop() -> None:
            await router.shutdown(config.router.shutdown_grace)
            http_done.set()

        async def watch_hangups() -> None:
            with trio.open_signal_receiver(signal.SIGHUP) as hangups:
                async for _ in hangups:
                    await reload_config(router)

        nursery.start_soon(watch_signals)
        nursery.start_soon(watch_hangups)
        url = f"http://{config.router.host}:{config.router.port}"
        log.info("llama-router listening on %s", url)
        if on_ready is not None:
            on_ready(url)
        await serve(app, hypercorn_config(config), shutdown_trigger=http_done.wait)
        nursery.cancel_scope.cancel()


def main_run(config: Config) -> int:
    try:
        trio.run(run_server, config)
    except KeyboardInterrupt:
        return 130
    return 0


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2
