"""Per-GPU memory, utilisation and residency, sampled every few seconds and kept for the last hour.

Each sample holds, per GPU the scheduler knows: the budget, the memory the scheduler predicts its resident
replicas use, which models are resident and in what state, and, where the GPU's memory can be read (NVML,
amdsmi or sysfs, through the router's :class:`~router.hosts.gpu_monitor.GpuMonitor`), the memory in use, the
card's total, the part other processes hold and its utilisation. Where nothing can be read, the measured
fields are None and the dashboard draws the predicted use against the budgets.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from router.deploy.rpc_devices import is_rpc, local_gpus
from router.hosts.gpu_monitor import GpuMonitor
from router.hosts.gpu_readers import GpuReading
from router.shell.views import RouterView
from statemachine import queries, replica_state

log = logging.getLogger("router")

SAMPLE_EVERY = 2.0
KEEP_SECONDS = 3600.0
FAILURES_BEFORE_GIVING_UP = 5

Reader = Callable[[], Mapping[int, GpuReading]]


@attrs.frozen
class GpuPoint:
    """One GPU at one instant. ``residents``: (model, state) pairs, state one of loading, ready,
    draining, stopping."""

    gpu: int
    budget: int | None
    predicted: int
    used: int | None = None
    total: int | None = None
    util: float | None = None
    residents: tuple[tuple[str, str], ...] = ()
    foreign: int | None = None


@attrs.frozen
class Sample:
    at: float  # wall-clock seconds, to the millisecond (the value clients pass back as ``since``)
    gpus: tuple[GpuPoint, ...]


def gpu_points(
    view: RouterView, readings: Mapping[int, GpuReading], foreign: Mapping[int, int] | None = None
) -> tuple[GpuPoint, ...]:
    """The scheduler's view of every GPU right now, with ``readings`` (and the bytes other processes
    hold, ``foreign``) merged in where present."""
    foreign = foreign or {}
    state = view.state
    points = []
    for device in sorted(state.settings.devices.values(), key=lambda d: d.id):
        if is_rpc(device.id):
            continue  # RPC devices have their own section in /status
        residents = tuple(sorted((r.model, replica_state(r)) for r in state.replicas if device.id in r.gpus))
        reading = readings.get(device.id)
        points.append(
            GpuPoint(
                gpu=device.id,
                budget=device.budget,
                predicted=queries.used(state, device.id),
                used=None if reading is None else reading.used,
                total=None if reading is None else reading.total,
                util=None if reading is None else reading.util,
                residents=residents,
                foreign=foreign.get(device.id),
            )
        )
    return tuple(points)


class GpuSampler:
    """Samples the GPUs of ``router`` every ``interval`` seconds and keeps ``keep`` seconds of samples.

    ``reader`` returns NVML-style readings (called on a worker thread); without one, NVML is opened when
    ``use_nvml`` is true and present on the host.
    """

    def __init__(
        self,
        view: RouterView,
        *,
        monitor: GpuMonitor | None = None,
        interval: float = SAMPLE_EVERY,
        keep: float = KEEP_SECONDS,
        reader: Reader | None = None,
        use_nvml: bool = True,
    ) -> None:
        self.view = view
        self.monitor = monitor  # reads the GPUs where ``reader`` does not
        self.interval = interval
        self.keep = keep
        self.samples: collections.deque[Sample] = collections.deque(maxlen=max(2, int(keep / interval) + 1))
        self.readings: dict[int, GpuReading] = {}
        self.foreign: dict[int, int] = {}
        self._reader: Reader | None = reader
        self._use_monitor = reader is None and use_nvml and monitor is not None
        self._failures = 0

    @property
    def measuring(self) -> bool:
        """Whether GPU memory is measured (a driver or another reader) rather than only predicted."""
        return self._reader is not None or (self._use_monitor and bool(self.view.gpu_reader_kind))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.sample()
            except Exception:  # a sample lost is no reason to stop the router
                log.exception("GPU sampler: taking a sample failed; carrying on")
            await trio.sleep(self.interval)

    async def _read(self) -> None:
        if self._reader is not None:
            self.readings = dict(await trio.to_thread.run_sync(self._reader))
            self.foreign = {}
            return
        ours = self.view.our_pids()
        monitor = self.monitor
        assert monitor is not None
        measures = await trio.to_thread.run_sync(monitor.read, ours)
        if not measures and monitor.failures:
            raise RuntimeError("the GPU driver did not answer")
        self.readings = {gpu: m.reading for gpu, m in measures.items()}
        self.foreign = {gpu: m.foreign for gpu, m in measures.items()}

    async def sample(self) -> Sample:
        """Take one sample now (reading the GPUs on a worker thread) and keep it."""
        if self._reader is not None or self._use_monitor:
            try:
                await self._read()
                self._failures = 0
            except Exception as exc:
                self._failures += 1
                log.warning("GPU sampler: reading the GPUs failed: %s", exc)
                self.readings, self.foreign = {}, {}
                if self._failures >= FAILURES_BEFORE_GIVING_UP:
                    log.warning("GPU sampler: giving up on measured GPU memory; showing predictions only")
                    self._reader, self._use_monitor = None, False
        points = gpu_points(self.view, self.readings, self.foreign)
        sample = Sample(round(time.time(), 3), points)
        self.samples.append(sample)
        return sample

    def timeline(self, since: float | None = None) -> dict[str, Any]:
        """The kept samples newer than ``since`` (wall-clock seconds), one column per field and GPU."""
        chosen = [s for s in self.samples if since is None or s.at > since]
        ids = (
            [p.gpu for p in chosen[-1].gpus]
            if chosen
            else sorted(local_gpus(self.view.state.settings.devices))
        )
        gpus = []
        for index, gpu in enumerate(ids):
            points = [s.gpus[index] for s in chosen if index < len(s.gpus)]
            gpus.append(
                {
                    "id": gpu,
                    "budget": [p.budget for p in points],
                    "predicted": [p.predicted for p in points],
                    "used": [p.used for p in points],
                    "total": [p.total for p in points],
                    "util": [p.util for p in points],
                    "foreign": [p.foreign for p in points],
                    "residents": [[list(r) for r in p.residents] for p in points],
                }
            )
        return {
            "interval": self.interval,
            "window": self.keep,
            "measured": self.measuring,
            "now": time.time(),
            "t": [s.at for s in chosen],
            "gpus": gpus,
        }
