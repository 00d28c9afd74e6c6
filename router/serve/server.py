"""Start the whole router: config → placement → scheduler + supervisor → HTTP server; drain on SIGTERM."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import resource
import signal
from collections.abc import Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from router.config.load import Config
from router.config.source import ConfigSource
from router.deploy.deployment import prepare
from router.hosts.gpu_monitor import GpuMonitor
from router.http.request_headers import HEADERS_LIMIT
from router.journal.history_lock import history_lock
from router.serve import hypercorn_fixes
from router.serve.front import take_connection
from router.serve.listen import open_sockets
from router.serve.wiring import replica_client, wire
from router.shell.reload import check_llama_servers, reload_config
from router.shell.runtime import Router

log = logging.getLogger("router")
LAST_RESORT_AFTER = 10.0
REPEAT_WINDOW = 1.0  # a stop signal repeated this soon after the first is the same request (a double Ctrl-C)
FILES_RESERVED = 128  # descriptors kept for replicas' pipes, the history database, logs and the like
LISTEN_BACKLOG = 4096  # connections the kernel queues before they are accepted


def hypercorn_config(config: Config) -> HypercornConfig:
    hc = HypercornConfig()
    hc.bind = [f"{config.router.host}:{config.router.port}"]
    hc.accesslog = None
    hc.keep_alive_timeout = config.router.keep_alive_timeout
    # The router drains in-flight work itself before it stops the HTTP server, so the server's own grace
    # only has to flush the last bytes.
    hc.graceful_timeout = 1.0
    hc.h11_max_incomplete_size = HEADERS_LIMIT
    hc.read_timeout = 300
    # Room for a burst of clients connecting at once (the kernel caps it at net.core.somaxconn): with
    # hypercorn's 100, a crowd overflows the queue and the connections it drops are reset.
    hc.backlog = LISTEN_BACKLOG
    return hc


def connection_budget(config: Config) -> int:
    """``max_connections``, or what the open-file limit allows. The limit is first raised towards its hard
    maximum (at most 65536): each client connection costs a descriptor, two while its request is relayed,
    and replicas, logs and the history database need some too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if wanted > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if config.router.max_connections is not None:
        return config.router.max_connections
    return max(16, (soft - FILES_RESERVED) // 2)


def build_router(config: Config, source: ConfigSource | None = None) -> Router:
    """A router for ``config``; ``source`` is where reloads read the configuration again (None: its file)."""
    monitor = GpuMonitor()
    deployment = prepare(config, monitor)
    check_llama_servers(deployment)
    return Router(deployment, gpus=monitor, source=source)


async def run_server(
    config: Config,
    *,
    on_ready: Callable[[str], None] | None = None,
    router: Router | None = None,
    source: ConfigSource | None = None,
    sockets: Sockets | None = None,
    freeze: bool = False,
) -> None:
    """Serve until shutdown. ``source``: where reloads read the configuration again (None: its file).
    ``sockets``: already listening (``router.serve.listen.open_sockets``); None binds the configured address
    here. ``freeze``: the process is the router's own (``main_run``): what startup built is moved out of the
    garbage collector's sight once the router is wired. The history database is held for this router
    (``history_lock``) first."""
    hypercorn_fixes.apply(config.router.send_timeout, connection_budget(config), front=take_connection)
    try:
        with history_lock(config):
            router = router or build_router(config, source)
            await _serve_router(config, router, on_ready, sockets, freeze)
    finally:
        if router is not None:
            router.gpus.close()


async def _serve_router(
    config: Config,
    router: Router,
    on_ready: Callable[[str], None] | None,
    sockets: Sockets | None,
    freeze: bool = False,
) -> None:
    async with replica_client(config) as client, trio.open_nursery() as nursery:
        wired = await wire(nursery, config, router, client)
        if freeze:
            # The modules, the app and the configuration live as long as the process. A full collection
            # walks every object the collector tracks (about 40 ms for what startup leaves), and one comes
            # now and then while requests are served: frozen, startup's objects are no longer walked.
            gc.collect()
            gc.freeze()
        http_done = trio.Event()
        hc = hypercorn_config(config)

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for sig in signals:
                    name = signal.Signals(sig).name
                    log.info("%s: draining (up to %.0f s), then stopping", name, config.router.shutdown_grace)
                    nursery.start_soon(stop)
                    break
                first = trio.current_time()
                async for _ in signals:
                    if trio.current_time() - first <= REPEAT_WINDOW:
                        log.info(
                            "%s again within %g s of the first: the same request (send it again to stop now)",
                            name,
                            REPEAT_WINDOW,
                        )
                        continue
                    log.warning("second signal: stopping now")
                    router.submit_shutdown_now()
                    nursery.start_soon(last_resort)
                    break

        async def last_resort() -> None:
            # Replicas are stopped and stalled writes cut within seconds; if anything still holds the
            # process after that, exit anyway (replicas die with the router: they get SIGKILL on its exit).
            await trio.sleep(LAST_RESORT_AFTER)
            log.error("still running %.0f s after the second signal: exiting now", LAST_RESORT_AFTER)
            os._exit(1)

        async def stop() -> None:
            await router.shutdown(config.router.shutdown_grace)
            http_done.set()
            # hypercorn lets connections finish their last bytes for its graceful timeout; a client that
            # is not reading them must not hold the process past that.
            await trio.sleep(hc.graceful_timeout + 0.5)
            cut = hypercorn_fixes.cut_stalled_writes()
            if cut:
                log.info("shutdown: cut %d connection(s) whose clients stopped reading", cut)

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
        await worker_serve(
            wrap_app(wired.data_path, hc.wsgi_max_body_size, None),
            hc,
            sockets=sockets,
            shutdown_trigger=http_done.wait,
        )
        wired.pool.close()
        nursery.cancel_scope.cancel()


def main_run(config: Config, source: ConfigSource | None = None) -> int:
    """Run the router; the listening socket is bound first, so a taken port fails before anything starts
    (:class:`ListenError`, naming the address and what to change)."""
    sockets = open_sockets(hypercorn_config(config), config.router.host, config.router.port)
    try:
        trio.run(functools.partial(run_server, config, source=source, sockets=sockets, freeze=True))
    except KeyboardInterrupt:
        return 130
    return 0
