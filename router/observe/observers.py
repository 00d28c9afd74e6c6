"""The parts that watch one running router — the request history, the GPU sampler, the metrics and the
probe of its rpc-servers — built and started together, once (by ``router.serve.wiring``)."""

from __future__ import annotations

import time

import attrs
import httpx
import trio

from router.config.load import Config
from router.journal.history import History
from router.observe.gpu_sampler import GpuSampler
from router.observe.metrics import RouterMetrics
from router.observe.rpc_status import held_endpoints, rpc_endpoints
from router.shell.quota import DAY
from router.shell.runtime import Router
from router.shell.views import RouterView


@attrs.define(eq=False)
class Observers:
    """The parts that watch one router; their tasks run in the nursery given to ``start_observers``."""

    history: History
    sampler: GpuSampler
    metrics: RouterMetrics


async def start_observers(
    nursery: trio.Nursery,
    config: Config,
    router: Router,
    client: httpx.AsyncClient,
    *,
    sampler: GpuSampler | None = None,
) -> Observers:
    """Build the observers of ``router`` and start their tasks in ``nursery``; ``client`` reads the
    replicas' own metrics."""
    settings = config.router
    history = History(
        settings.history_db, max_rows=settings.history_max_rows, max_age_days=settings.history_max_age_days
    )
    view = RouterView(router)
    router.record_listeners.append(history.add)
    sampler = sampler or GpuSampler(view, monitor=router.gpus)
    metrics = RouterMetrics(view, client=client, history=history, sampler=sampler)
    router.record_listeners.append(metrics.observe)
    router.listeners.append(metrics.on_happening)
    await nursery.start(history.run)
    # A restart forgives no key its tokens of the last day.
    router.quotas.seed(await history.token_use(time.time() - DAY), time.time())
    await nursery.start(sampler.run)
    await nursery.start(router.rpc_probe.run, lambda: rpc_endpoints(view), lambda: held_endpoints(view))
    return Observers(history, sampler, metrics)
