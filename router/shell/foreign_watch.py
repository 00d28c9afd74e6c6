"""Memory other processes take on the GPUs (a desktop, a game, a training job), told to the scheduler as it
changes: ``ForeignMemory(gpu, bytes)``, the bytes they hold beyond what the GPU's budget leaves them.

Every second the router's :class:`~router.hosts.gpu_monitor.GpuMonitor` reads the GPUs on a worker thread;
a GPU's figure is ``budget − available`` (what the router may use now against what it planned with), never
below 0. A change of at least 64 MiB, or to or from 0, is reported. The scheduler then counts that memory
against every load (a load goes to another GPU, or waits) and never stops a resident for it
(``statemachine.placement``); once the memory is back, the waiting loads start. A reading that cannot tell
our replicas' memory from other processes' (no process list, no baseline) is not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

from router.hosts.gpu_monitor import GpuMonitor, Ours
from router.placement.budgets import GpuMeasure
from statemachine import Event, ForeignMemory, State

log = logging.getLogger("router")

WATCH_EVERY = 1.0
SIGNIFICANT = 64 << 20
TRUSTED = ("idle", "processes", "baseline")


def beyond_budget(measures: Mapping[int, GpuMeasure], budgets: Mapping[int, int | None]) -> dict[int, int]:
    """Per GPU with a budget and a trusted reading: the bytes other processes hold beyond what it leaves."""
    out = {}
    for gpu, measure in measures.items():
        budget = budgets.get(gpu)
        if budget is not None and measure.method in TRUSTED:
            out[gpu] = max(0, budget - measure.available)
    return out


def worth_telling(known: Mapping[int, int], now: Mapping[int, int]) -> dict[int, int]:
    """The figures of ``now`` that differ enough from what the scheduler ``known``s to be reported."""
    out = {}
    for gpu, figure in now.items():
        before = known.get(gpu, 0)
        if (figure == 0) != (before == 0) or abs(figure - before) >= SIGNIFICANT:
            out[gpu] = figure
    return out


async def watch_foreign(
    monitor: GpuMonitor,
    state: Callable[[], State],
    ours: Callable[[], Ours],
    submit: Callable[[Event], None],
    every: float = WATCH_EVERY,
) -> None:
    """Read the GPUs every ``every`` seconds and submit a ForeignMemory for each figure worth telling."""
    while True:
        await trio.sleep(every)
        try:
            measures = await trio.to_thread.run_sync(monitor.read, ours())
        except Exception:  # a lost reading is no reason to stop watching
            log.exception("reading the GPUs for other processes' memory failed; carrying on")
            continue
        if not measures:
            if not monitor.kind:
                return  # nothing can be read on this host: nothing to watch
            continue
        current = state()
        budgets = {gpu: current.settings.budget(gpu) for gpu in measures}
        for gpu, figure in sorted(worth_telling(current.foreign, beyond_budget(measures, budgets)).items()):
            if figure:
                log.info("GPU %d: other processes hold %.2f GiB beyond its budget", gpu, figure / (1 << 30))
            else:
                log.info("GPU %d: other processes no longer hold memory beyond its budget", gpu)
            submit(ForeignMemory(gpu, figure))
