"""The router's one view of GPU memory: readings, our share of them, and the check before every load.

A :class:`GpuMonitor` owns the driver reader (NVML, amdsmi or sysfs; see ``gpu_readers``) and, per GPU, the
free memory last measured while none of our replicas was there (the baseline that ``measure`` falls back
on). Placement asks it for budgets at startup and on every reload; the GPU sampler reads through it every
few seconds; the owner task asks it, right before starting a replica, whether memory held by other
processes has grown so far that the replica no longer fits (:meth:`GpuMonitor.shortfall`).

Reads are synchronous and short (a handful of driver calls); they are serialised by a lock because the
sampler reads on a worker thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet

from router.hosts.gpu_readers import GpuReading, GpuSource, open_source
from router.placement.budgets import DeviceBudget, GpuMeasure, measure

log = logging.getLogger("router")

GiB = 1 << 30
Ours = Mapping[int, AbstractSet[int]]  # GPU id -> process ids of our live replicas there


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


class GpuMonitor:
    """GPU readings and our share of them. ``opener`` returns the reader (default: :func:`open_source`);
    it is called once, lazily, and None (no GPU readable) is remembered."""

    def __init__(self, opener: Callable[[], GpuSource | None] = open_source) -> None:
        self._opener: Callable[[], GpuSource | None] | None = opener
        self._source: GpuSource | None = None
        self._lock = threading.Lock()
        self.baselines: dict[int, int] = {}
        self.last: dict[int, GpuMeasure] = {}  # the latest measurement of every readable GPU
        self.failures = 0

    @property
    def kind(self) -> str:
        """Which reader answers (``nvml``, ``amdsmi``, ``sysfs``), or ``""`` when none does."""
        return self._source.kind if self._source is not None else ""

    def _reader(self) -> GpuSource | None:
        if self._opener is not None:
            opener, self._opener = self._opener, None
            self._source = opener()
            if self._source is not None:
                log.info("GPU memory is read through %s", self._source.kind)
        return self._source

    def read(self, ours: Ours | None = None) -> dict[int, GpuMeasure]:
        """Read every GPU now and split its use into ours and foreign; empty when nothing is readable.

        A reading taken while none of ours is on a GPU becomes that GPU's baseline.
        """
        ours = ours or {}
        with self._lock:
            source = self._reader()
            if source is None:
                return {}
            try:
                readings: dict[int, GpuReading] = source.read()
                self.failures = 0
            except Exception as exc:  # a driver call failed: no measurement this time
                self.failures += 1
                log.warning("reading GPU memory failed: %s", exc or type(exc).__name__)
                return {}
            out = {}
            for gpu, reading in readings.items():
                pids = ours.get(gpu)
                if pids is None:
                    self.baselines[gpu] = reading.free
                out[gpu] = measure(reading, pids, self.baselines.get(gpu))
            self.last = out
            return out

    def budgets(self, ours: Ours | None = None) -> dict[int, DeviceBudget]:
        """Measured budgets of every readable GPU (what placement plans against)."""
        measures = self.read(ours)
        return {gpu: DeviceBudget.measured(gpu, m, self.kind) for gpu, m in measures.items()}

    def shortfall(
        self, model: str, need: Mapping[int, int], planned: Mapping[int, int | None], ours: Ours
    ) -> str | None:
        """Why a replica of ``model`` must not start now, or None when it may.

        ``need`` is, per GPU, what our replicas will hold there once it runs (itself included, as the
        scheduler predicts); ``planned`` the budget the scheduler planned with. A replica is refused only
        when memory held by other processes grew since then (the available memory is below the planned
        budget) and the predicted need no longer fits: a model that fits, or an operator override that was
        over budget from the start, goes ahead.
        """
        measures = self.read(ours)
        clauses = []
        for gpu, bytes_needed in sorted(need.items()):
            m = measures.get(gpu)
            budget = planned.get(gpu)
            if m is None or budget is None or m.available >= budget or bytes_needed <= m.available:
                continue
            others = ", ".join(f"pid {p.pid} {_gib(p.used or 0)} GiB" for p in m.others[:5])
            held = f"other processes hold {_gib(m.foreign)} GiB" + (f" ({others})" if others else "")
            clauses.append(
                f"GPU {gpu} has {_gib(m.reading.total)} GiB, {held}, leaving {_gib(m.available)} GiB; "
                f"{model} needs {_gib(bytes_needed)} GiB there with our other replicas "
                f"(planned against {_gib(budget)} GiB)"
            )
        if not clauses:
            return None
        return (
            f"not enough GPU memory to start {model}: "
            + "; ".join(clauses)
            + ": stop what holds that memory, or reload (POST /reload) to plan smaller contexts"
        )

    def close(self) -> None:
        with self._lock:
            if self._source is not None:
                self._source.close()
