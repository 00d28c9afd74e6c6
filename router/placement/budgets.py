"""Memory budgets of the devices models are placed on: what this router may use on each.

A GPU's budget is its total memory minus what *other* processes (and the driver) hold there: memory our own
replicas use counts as ours, so planning again while they are resident (a reload, a SIGHUP) gives the same
budgets as planning on an idle GPU. :func:`measure` separates the two from one driver reading:

``idle``          none of our replicas is on the GPU: everything in use is someone else's.
``processes``     the driver lists the processes on the GPU with their bytes (NVML, amdsmi) and ours are
                  among them: ours are subtracted from the use, the rest is foreign.
``baseline``      no usable per-process list (sysfs, drivers without accounting, a container whose process
                  ids differ from the driver's): the free memory last measured while none of ours was on the
                  GPU is kept and trusted, so our replicas can never shrink the budget.
``unattributed``  ours are there and no baseline exists: everything in use counts as foreign.

The config can declare ``[devices.N] memory_mib``; a declared budget wins over the measured one in both
directions. A GPU that is configured but whose memory nobody can read is still a GPU, with an unknown
budget: placement then offloads every layer and picks the default context (see ``fit``), never the CPU.
Only models with no GPU at all (``gpus = []``, or ``num_gpus = 0``) are placed on the ``"cpu"`` device,
whose budget is ``MemAvailable`` from ``/proc/meminfo``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

import attrs

from router.placement.footprint import CPU
from router.placement.readings import GpuReading, ProcessUse

__all__ = [
    "DeviceBudget",
    "GpuMeasure",
    "budget_bytes",
    "gather_budgets",
    "host_budget",
    "measure",
]

MiB = 1 << 20


@attrs.frozen
class GpuMeasure:
    """One reading split into our replicas' bytes and everyone else's (``foreign``: other processes and
    the driver). ``others`` lists the foreign processes the driver named (empty where it names none)."""

    reading: GpuReading
    foreign: int
    ours: int
    method: str
    others: tuple[ProcessUse, ...] = ()

    @property
    def available(self) -> int:
        """Bytes this router may use on the GPU: total minus foreign."""
        return max(0, self.reading.total - self.foreign)


def measure(reading: GpuReading, our_pids: AbstractSet[int] | None, baseline_free: int | None) -> GpuMeasure:
    """Split ``reading`` into ours and foreign (pure; see the module docstring for the methods).

    ``our_pids`` is None when no process of our replicas is on this GPU, else their process ids;
    ``baseline_free`` the free bytes last measured while none of ours was there.
    """
    procs = reading.processes
    if our_pids is None:
        others = tuple(p for p in procs or ())
        return GpuMeasure(reading, reading.used, 0, "idle", others)
    if procs is not None and all(p.used is not None for p in procs) and any(p.pid in our_pids for p in procs):
        ours = sum(p.used or 0 for p in procs if p.pid in our_pids)
        others = tuple(p for p in procs if p.pid not in our_pids)
        return GpuMeasure(reading, max(0, reading.used - ours), ours, "processes", others)
    others = tuple(p for p in procs or () if p.pid not in our_pids)
    if baseline_free is not None:
        foreign = max(0, reading.total - baseline_free)
        return GpuMeasure(reading, foreign, max(0, reading.used - foreign), "baseline", others)
    return GpuMeasure(reading, reading.used, 0, "unattributed", others)


@attrs.frozen
class DeviceBudget:
    """One device's memory as the router knows it (bytes).

    ``device`` is a GPU id or ``"cpu"``. ``total`` and ``available`` (what this router may use: total minus
    foreign) come from the driver or /proc/meminfo (None when not measured); ``foreign`` and ``ours`` split
    the memory in use (None when not measured); ``method`` says how (see :func:`measure`; ``"host"`` for the
    CPU); ``declared`` is ``[devices.N] memory_mib`` in bytes. ``reader`` names the driver interface the
    reading came from (``nvml``, ``amdsmi``, ``sysfs``). ``kind`` overrides the kind the plan document
    derives from the id (``"rpc"`` for a device another machine lends; empty: ``gpu`` or ``cpu``).
    """

    device: int | str
    name: str = ""
    bus_id: str = ""
    total: int | None = None
    available: int | None = None
    declared: int | None = None
    foreign: int | None = None
    ours: int | None = None
    method: str = ""
    reader: str = ""
    kind: str = ""

    @property
    def budget(self) -> int | None:
        """Bytes placement may plan for: the declared budget if any, else the available memory."""
        return self.declared if self.declared is not None else self.available

    @property
    def source(self) -> str:
        if self.declared is not None:
            return "config"
        if self.available is None:
            return "unknown"
        return "host" if self.device == CPU else (self.reader or "measured")

    @classmethod
    def measured(cls, gpu: int, m: GpuMeasure, reader: str) -> DeviceBudget:
        r = m.reading
        return cls(
            device=gpu,
            name=r.name,
            bus_id=r.bus_id,
            total=r.total,
            available=m.available,
            foreign=m.foreign,
            ours=m.ours,
            method=m.method,
            reader=reader,
        )


def _meminfo(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError), path.open() as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
                values[key.strip()] = int(parts[0]) * scale
    return values


def host_budget(meminfo: Path = Path("/proc/meminfo")) -> DeviceBudget:
    """The ``"cpu"`` device: MemTotal and MemAvailable of the host (None where /proc/meminfo is absent)."""
    values = _meminfo(meminfo)
    return DeviceBudget(
        device=CPU,
        name="host memory",
        total=values.get("MemTotal"),
        available=values.get("MemAvailable"),
        method="host",
    )


def gather_budgets(
    declared_mib: Mapping[int, int | None] | None = None,
    *,
    num_gpus: int | None = None,
    measured: Callable[[], Mapping[int, DeviceBudget]] = dict,
    host: Callable[[], DeviceBudget] | None = None,
) -> dict[int | str, DeviceBudget]:
    """Budgets of every GPU, by id, from the measured ones and the declared ``[devices.N] memory_mib``.

    ``num_gpus`` (``router.num_gpus``) fixes the GPU ids to 0..num_gpus-1: GPUs neither source knows get
    an unknown budget and measured GPUs beyond the count are left out (0: no GPU is read at all). ``host``,
    when given, adds the ``"cpu"`` device for models that run without a GPU.
    """
    found = {} if num_gpus == 0 else dict(measured())
    out: dict[int | str, DeviceBudget] = {}
    out.update(found)
    for gpu, mib in (declared_mib or {}).items():
        if mib is None:
            continue
        out[gpu] = attrs.evolve(found.get(gpu, DeviceBudget(device=gpu)), declared=int(mib) * MiB)
    if num_gpus is not None:
        out = {gpu: b for gpu, b in out.items() if isinstance(gpu, int) and gpu < num_gpus}
        for gpu in range(num_gpus):
            out.setdefault(gpu, DeviceBudget(device=gpu))
    gpus: dict[int | str, DeviceBudget] = dict(sorted((g, b) for g, b in out.items() if isinstance(g, int)))
    if host is not None:
        gpus[CPU] = host()
    return gpus


def budget_bytes(budgets: Mapping[int | str, DeviceBudget]) -> dict[int | str, int | None]:
    """The plain ``device -> bytes (None = unknown)`` mapping placement decisions take."""
    return {device: b.budget for device, b in budgets.items()}
