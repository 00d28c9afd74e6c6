"""Memory budgets of the devices models are placed on.

Three sources, merged by :func:`gather_budgets`:

* NVML (through ``pynvml``): total and free memory of every NVIDIA GPU. When the library is missing, the
  driver is absent or any call fails, NVML contributes nothing: one debug log line, no warning, no
  traceback. (AMD GPUs are not queried; declare their budgets in the config.)
* The config: ``[devices.N] memory_mib``. A declared budget wins over what NVML reports, in both
  directions: an operator can keep part of a GPU for something else (declare less) or plan for a GPU the
  router cannot query (declare it outright). The budget of a GPU known only through NVML is its *free*
  memory at the time of the query, so memory other programs hold is respected.
* The host: on a machine with no GPU at all (NVML found none and the config declares none), a single
  ``"cpu"`` device whose budget is ``MemAvailable`` from ``/proc/meminfo``. Models then run on the CPU
  (``-ngl 0``) against host memory.

A GPU whose budget is not known (declared nowhere, not visible to NVML) has budget None; placement then
gives the verdict "unknown-budget" instead of guessing.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from router.placement.footprint import CPU

__all__ = ["DeviceBudget", "budget_bytes", "gather_budgets", "host_budget", "nvml_budgets"]

log = logging.getLogger(__name__)
MiB = 1 << 20


@attrs.frozen
class DeviceBudget:
    """One device's memory as the router knows it.

    ``device`` is a GPU id (NVML index, which is what CUDA_VISIBLE_DEVICES takes in the default PCI order)
    or ``"cpu"``. ``total``/``free`` are bytes reported by NVML or /proc/meminfo (None when not queried);
    ``declared`` is bytes from ``[devices.N] memory_mib`` (None when not declared); ``source`` says which
    value :attr:`budget` uses: ``"config"``, ``"nvml"``, ``"host"`` or ``"unknown"``.
    """

    device: int | str
    name: str = ""
    total: int | None = None
    free: int | None = None
    declared: int | None = None

    @property
    def budget(self) -> int | None:
        """Bytes placement may plan for: the declared budget if any, else the free memory."""
        return self.declared if self.declared is not None else self.free

    @property
    def source(self) -> str:
        if self.declared is not None:
            return "config"
        if self.free is None:
            return "unknown"
        return "host" if self.device == CPU else "nvml"


def _import_pynvml() -> Any:
    # pynvml's package wrapper warns about its own deprecation on import; that is not our user's problem.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pynvml

    return pynvml


def nvml_budgets(loader: Callable[[], Any] = _import_pynvml) -> dict[int, DeviceBudget]:
    """Total and free memory of every GPU NVML sees, by NVML index; empty when NVML is unusable."""
    try:
        nvml = loader()
        nvml.nvmlInit()
    except Exception as exc:  # missing module, missing driver, NVMLError_*: all mean "no NVML here"
        log.debug("NVML unavailable, GPU memory not queried: %s", exc or type(exc).__name__)
        return {}
    out: dict[int, DeviceBudget] = {}
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            out[index] = DeviceBudget(
                device=index, name=str(name), total=int(info.total), free=int(info.free)
            )
    except Exception as exc:
        log.debug("NVML query failed, GPU memory not queried: %s", exc or type(exc).__name__)
        out = {}
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out


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
        device=CPU, name="host memory", total=values.get("MemTotal"), free=values.get("MemAvailable")
    )


def gather_budgets(
    declared_mib: Mapping[int, int | None] | None = None,
    *,
    num_gpus: int | None = None,
    nvml: Callable[[], dict[int, DeviceBudget]] = nvml_budgets,
    host: Callable[[], DeviceBudget] = host_budget,
) -> dict[int | str, DeviceBudget]:
    """Budgets of every device, GPUs by id, from NVML and the declared ``[devices.N] memory_mib`` values.

    ``num_gpus`` (``router.num_gpus``) fixes the GPU ids to 0..num_gpus-1: GPUs neither source knows get
    an unknown budget, NVML GPUs beyond the count are left out, and 0 means a CPU-only host. When no GPU
    is known at all the result is ``{"cpu": host()}``: models run on the CPU against host memory.
    """
    found = {} if num_gpus == 0 else nvml()
    out: dict[int, DeviceBudget] = dict(found)
    for gpu, mib in (declared_mib or {}).items():
        if mib is None:
            continue
        out[gpu] = attrs.evolve(found.get(gpu, DeviceBudget(device=gpu)), declared=int(mib) * MiB)
    if num_gpus is not None:
        out = {gpu: b for gpu, b in out.items() if gpu < num_gpus}
        for gpu in range(num_gpus):
            out.setdefault(gpu, DeviceBudget(device=gpu))
    if not out:
        return {CPU: host()}
    return dict(sorted(out.items()))


def budget_bytes(budgets: Mapping[int | str, DeviceBudget]) -> dict[int | str, int | None]:
    """The plain ``device -> bytes (None = unknown)`` mapping placement decisions take."""
    return {device: b.budget for device, b in budgets.items()}
