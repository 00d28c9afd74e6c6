"""Per-GPU memory, utilisation and residency, sampled every few seconds and kept for the last hour.

Each sample holds, per GPU the scheduler knows: the declared budget, the memory the scheduler predicts its
resident replicas use, which models are resident and in what state, and, where NVML answers, the memory
the driver reports in use, the card's total and its utilisation. Without NVML (no NVIDIA driver, no GPU)
the measured fields are None and the dashboard draws the predicted use against the budgets.

NVML numbers GPUs in its own order; the router's GPU ids are CUDA ordinals. They agree when
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set (recommended on machines with mixed GPU models).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from .runtime import Router

log = logging.getLogger("router")

SAMPLE_EVERY = 2.0
KEEP_SECONDS = 3600.0
NVML_FAILURES_BEFORE_GIVING_UP = 5


@attrs.frozen
class GpuReading:
    """What NVML says about one GPU: bytes in use, bytes in all, utilisation in percent (None: unknown)."""

    used: int
    total: int
    util: float | None = None


Reader = Callable[[], Mapping[int, GpuReading]]


class NvmlReader:
    """Reads every GPU through NVML. ``open()`` returns None where NVML is missing or has no driver."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    @classmethod
    def open(cls) -> NvmlReader | None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            return cls(pynvml)
        except Exception as exc:  # NVMLError, or a library that cannot be loaded
            log.debug("NVML unavailable: %s", exc)
            return None

    def __call__(self) -> dict[int, GpuReading]:
        readings = {}
        for index, handle in enumerate(self._handles):
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            util: float | None
            try:
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:  # some devices (MIG slices) do not report utilisation
                util = None
            readings[index] = GpuReading(int(memory.used), int(memory.total), util)
        return readings

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


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


@attrs.frozen
class Sample:
    at: float  # wall-clock seconds, to the millisecond (the value clients pass back as ``since``)
    gpus: tuple[GpuPoint, ...]


def replica_state(phase: str, draining: bool) -> str:
    return "draining" if draining and phase == "ready" else phase


def gpu_points(router: Router, readings: Mapping[int, GpuReading]) -> tuple[GpuPoint, ...]:
    """The scheduler's view of every GPU right now, with ``readings`` merged in where present."""
    state = router.state
    points = []
    for device in sorted(state.settings.devices.values(), key=lambda d: d.id):
        residents = tuple(
            sorted(
                (r.model, replica_state(r.phase, r.draining)) for r in state.replicas if device.id in r.gpus
            )
        )
        reading = readings.get(device.id)
        points.append(
            GpuPoint(
                gpu=device.id,
                budget=device.budget,
                predicted=state.used(device.id),
                used=None if reading is None else reading.used,
                total=None if reading is None else reading.total,
                util=None if reading is None else reading.util,
                residents=residents,
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
        router: Router,
        *,
        interval: float = SAMPLE_EVERY,
        keep: float = KEEP_SECONDS,
        reader: Reader | None = None,
        use_nvml: bool = True,
    ) -> None:
        self.router = router
        self.interval = interval
        self.keep = keep
        self.samples: collections.deque[Sample] = collections.deque(maxlen=max(2, int(keep / interval) + 1))
        self.readings: dict[int, GpuReading] = {}
        self._reader: Reader | None = reader
        self._open_nvml = reader is None and use_nvml
        self._nvml: NvmlReader | None = None
        self._failures = 0

    @property
    def measuring(self) -> bool:
        """Whether GPU memory is measured (NVML or another reader) rather than only predicted."""
        return self._reader is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._open_nvml:
            self._nvml = await trio.to_thread.run_sync(NvmlReader.open)
            self._reader = self._nvml
            if self._nvml is not None:
                log.info("GPU sampler: NVML reports %d GPU(s)", len(self._nvml._handles))
        task_status.started()
        try:
            while True:
                try:
                    await self.sample()
                except Exception:  # a sample lost is no reason to stop the router
                    log.exception("GPU sampler: taking a sample failed; carrying on")
                await trio.sleep(self.interval)
        finally:
            if self._nvml is not None:
                self._nvml.close()

    async def sample(self) -> Sample:
        """Take one sample now (reading NVML on a worker thread) and keep it."""
        reader = self._reader
        if reader is not None:
            try:
                self.readings = dict(await trio.to_thread.run_sync(reader))
                self._failures = 0
            except Exception as exc:
                self._failures += 1
                log.warning("GPU sampler: reading the GPUs failed: %s", exc)
                self.readings = {}
                if self._failures >= NVML_FAILURES_BEFORE_GIVING_UP:
                    log.warning("GPU sampler: giving up on measured GPU memory; showing predictions only")
                    self._reader = None
        sample = Sample(round(time.time(), 3), gpu_points(self.router, self.readings))
        self.samples.append(sample)
        return sample

    def timeline(self, since: float | None = None) -> dict[str, Any]:
        """The kept samples newer than ``since`` (wall-clock seconds), one column per field and GPU."""
        chosen = [s for s in self.samples if since is None or s.at > since]
        ids = [p.gpu for p in chosen[-1].gpus] if chosen else sorted(self.router.state.settings.devices)
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
