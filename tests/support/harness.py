"""Run the real router inside the test's Trio run, against simulated llama-servers.

``running_router(dir, models, ...)`` writes a configuration whose models are simulated ones (each model's
``sim`` entry holds the simulator's behaviour keys and its ``shape`` entry, if any, makes the model a
header-only GGUF; see ``tests.support.simconfig``), starts the router on a free port and yields a
:class:`RouterHandle`. ``serving`` and ``serving_config`` start it on a document or a loaded configuration.
The router as a separate process is in ``tests.support.routerproc``, the client side (streams, request
bodies, error checks) in ``tests.support.client``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from router.config.load import Config, config_from_dict
from router.config.source import ConfigSource
from router.serve.server import build_router, run_server
from router.shell.runtime import Router
from statemachine import State
from statemachine.queries import queued
from tests.support.client import wait_health
from tests.support.simconfig import config_document, with_replica_logs, write_config


@attrs.define(eq=False)
class RouterHandle:
    """A router running inside the test: its URL, the Router object, a client and the directories."""

    url: str
    router: Router
    config: Config
    client: httpx.AsyncClient
    dir: Path
    records: Path

    async def status(self) -> dict[str, Any]:
        response = await self.client.get("/status")
        response.raise_for_status()
        return dict(response.json())

    async def models(self) -> dict[str, Any]:
        response = await self.client.get("/v1/models")
        response.raise_for_status()
        return dict(response.json())

    async def wait_state(self, predicate: Callable[[State], bool], timeout: float = 10.0) -> State:
        """Wait until the scheduler's state satisfies ``predicate`` (woken by every event, no polling)."""
        with trio.fail_after(timeout):
            await self.router.wait_until(predicate)
        return self.router.state

    async def wait_ready(self, model: str, count: int = 1, timeout: float = 10.0) -> State:
        return await self.wait_state(
            lambda s: sum(1 for r in s.replicas if r.model == model and r.phase == "ready") >= count, timeout
        )

    async def wait_idle(self, timeout: float = 5.0) -> None:
        """Wait until the scheduler owns no request and the shell holds no ticket (nothing leaked)."""
        with trio.fail_after(timeout):
            await self.router.wait_until(lambda s: not s.requests and not self.router.tickets)

    def records_of(self, model: str) -> Path:
        return self.records / model


@contextlib.asynccontextmanager
async def running_router(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    peers: Mapping[str, Any] | None = None,
    rpc_devices: Mapping[str, Any] | None = None,
    client_timeout: float = 30.0,
) -> AsyncIterator[RouterHandle]:
    """Start the router in this Trio run against simulated ``models``; stop it (and its replicas) after."""
    doc = config_document(
        dir,
        models,
        router=router,
        devices=devices,
        defaults=defaults,
        pools=pools,
        peers=peers,
        rpc_devices=rpc_devices,
    )
    async with serving(dir, doc, client_timeout=client_timeout) as handle:
        yield handle


@contextlib.asynccontextmanager
async def serving(
    dir: Path, doc: Mapping[str, Any], *, client_timeout: float = 30.0
) -> AsyncIterator[RouterHandle]:
    """Write the configuration document ``doc``, start the router on it in this Trio run, stop it after.

    Replica log files go to ``dir/replica-logs`` unless ``doc`` names a directory."""
    doc = with_replica_logs(dir, doc)
    write_config(dir, doc)
    config = config_from_dict(doc, dir / "router.json")
    async with serving_config(dir, config, client_timeout=client_timeout) as handle:
        yield handle


@contextlib.asynccontextmanager
async def serving_config(
    dir: Path, config: Config, *, source: ConfigSource | None = None, client_timeout: float = 30.0
) -> AsyncIterator[RouterHandle]:
    """Start the router on ``config`` in this Trio run (reloads read ``source``, else the config file)."""
    the_router = build_router(config, source)
    url = f"http://{config.router.host}:{config.router.port}"
    refusals = _RefusalWatch()
    logging.getLogger("router").addHandler(refusals)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, config, the_router)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
            async with httpx.AsyncClient(base_url=url, timeout=client_timeout, limits=limits) as client:
                await wait_health(client)
                try:
                    yield RouterHandle(url, the_router, config, client, dir, dir / "records")
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        logging.getLogger("router").removeHandler(refusals)
    # The shell must never feed the scheduler an event it refuses: that means the two disagree.
    assert not refusals.messages, refusals.messages
    # Every request's life ended, whatever ended it (an answer, a client gone, a cancellation at any point):
    # with every handler gone, a ticket that is not finished is a slot the scheduler never got back.
    unended = {t.rid: t.phase.value for t in the_router.tickets.values() if not t.ended}
    assert not unended, f"requests whose life never ended: {unended}"


class _RefusalWatch(logging.Handler):
    """Collects the router's "scheduler refused an event" log lines."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("scheduler refused"):
            self.messages.append(message)


async def _serve(config: Config, router: Router) -> None:
    await run_server(config, router=router)


def queued_for(state: State, target: str) -> int:
    """How many requests for ``target`` wait in the scheduler's queue."""
    return sum(1 for r in queued(state) if r.target == target)


def inflight_of(state: State, model: str) -> int:
    return sum(len(r.inflight) for r in state.replicas if r.model == model)
