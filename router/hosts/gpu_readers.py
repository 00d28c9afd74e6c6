"""Reading GPU memory from the driver: NVML for NVIDIA, amdsmi or sysfs for AMD.

Every reader returns, per GPU id, a :class:`GpuReading`: name, PCI bus id, total and used bytes, utilisation
and, where the driver can list them, the processes holding memory on it with their bytes. GPU ids are the
ordinals the replicas' masking variables take:

* NVML numbers GPUs by PCI bus id. Replicas run with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA ordinal
  N (what ``CUDA_VISIBLE_DEVICES`` selects) is NVML index N, on mixed-GPU machines too.
* AMD GPUs are numbered in PCI bus order as well, which is how ROCm enumerates them for
  ``HIP_VISIBLE_DEVICES``. ``amdsmi`` (when importable) also lists processes and their VRAM; the sysfs
  fallback (``/sys/class/drm/card*/device/mem_info_vram_*``) has totals and use but no processes.

:func:`open_source` tries NVML, then amdsmi, then sysfs, and returns None when none of them sees a GPU;
nothing here raises for a missing driver (one debug line says why).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs

from router.placement.readings import GpuReading, ProcessUse

log = logging.getLogger("router.gpus")

MiB = 1 << 20


class GpuSource(Protocol):
    kind: str

    def read(self) -> dict[int, GpuReading]: ...

    def close(self) -> None: ...


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_pynvml() -> Any:
    # pynvml's package wrapper warns about its own deprecation on import; that is not our user's problem.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pynvml

    return pynvml


class NvmlSource:
    """NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py), kept open between reads."""

    kind = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]

    @classmethod
    def open(cls, loader: Callable[[], Any] = _import_pynvml) -> NvmlSource | None:
        try:
            nvml = loader()
            nvml.nvmlInit()
        except Exception as exc:  # missing module, library or driver: all mean "no NVML here"
            log.debug("NVML unavailable: %s", exc or type(exc).__name__)
            return None
        try:
            source = cls(nvml)
        except Exception as exc:
            log.debug("NVML did not list the GPUs: %s", exc or type(exc).__name__)
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            return None
        if not source._handles:
            source.close()
            return None
        return source

    def _processes(self, handle: Any) -> tuple[ProcessUse, ...] | None:
        nvml = self._nvml
        try:
            listed = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:  # not supported (some drivers, WSL): per-process accounting unavailable
            return None
        with contextlib.suppress(Exception):
            listed += list(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
        uses: dict[int, int | None] = {}
        for proc in listed:
            used = getattr(proc, "usedGpuMemory", None)
            used = None if used is None else int(used)
            pid = int(proc.pid)
            before = uses.get(pid, 0)
            uses[pid] = None if used is None or before is None else before + used
        return tuple(ProcessUse(pid, used) for pid, used in sorted(uses.items()))

    def read(self) -> dict[int, GpuReading]:
        nvml = self._nvml
        out = {}
        with self._lock:
            for index, handle in enumerate(self._handles):
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util: float | None = None
                with contextlib.suppress(Exception):  # MIG slices do not report utilisation
                    util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                name = bus = ""
                with contextlib.suppress(Exception):
                    name = _text(nvml.nvmlDeviceGetName(handle))
                with contextlib.suppress(Exception):
                    bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                out[index] = GpuReading(
                    index=index,
                    total=int(memory.total),
                    used=int(memory.used),
                    name=name,
                    bus_id=bus,
                    util=util,
                    processes=self._processes(handle),
                )
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


class AmdSmiSource:
    """AMD GPUs through the ``amdsmi`` module (ROCm's SMI library), in PCI bus order."""

    kind = "amdsmi"

    def __init__(self, smi: Any) -> None:
        self._smi = smi
        self._lock = threading.Lock()
        handles = list(smi.amdsmi_get_processor_handles())
        self._handles = sorted(handles, key=lambda h: _text(smi.amdsmi_get_gpu_device_bdf(h)))

    @classmethod
    def open(cls, loader: Callable[[], Any] | None = None) -> AmdSmiSource | None:
        try:
            if loader is not None:
                smi = loader()
            else:
                import amdsmi as smi  # type: ignore[import-not-found]
            smi.amdsmi_init()
            source = cls(smi)
        except Exception as exc:  # ImportError, AmdSmiLibraryException, ...
            log.debug("amdsmi unavailable: %s", exc or type(exc).__name__)
            return None
        if not source._handles:
            source.close()
            return None
        return source

    def _processes(self, handle: Any) -> tuple[ProcessUse, ...] | None:
        try:
            listed = self._smi.amdsmi_get_gpu_process_list(handle)
        except Exception:
            return None
        out = []
        for proc in listed:
            if not isinstance(proc, dict) or "pid" not in proc:
                return None
            vram = (proc.get("memory_usage") or {}).get("vram_mem")
            out.append(ProcessUse(int(proc["pid"]), None if vram is None else int(vram)))
        return tuple(out)

    def read(self) -> dict[int, GpuReading]:
        smi = self._smi
        out = {}
        with self._lock:
            for index, handle in enumerate(self._handles):
                vram = smi.amdsmi_get_gpu_vram_usage(handle)
                name = ""
                with contextlib.suppress(Exception):
                    name = _text(smi.amdsmi_get_gpu_asic_info(handle).get("market_name", ""))
                out[index] = GpuReading(
                    index=index,
                    total=int(vram["vram_total"]) * MiB,
                    used=int(vram["vram_used"]) * MiB,
                    name=name,
                    bus_id=_text(smi.amdsmi_get_gpu_device_bdf(handle)),
                    processes=self._processes(handle),
                )
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._smi.amdsmi_shut_down()


AMD_VENDOR = "0x1002"
_CARD = re.compile(r"card\d+")


@attrs.frozen
class _SysfsCard:
    bus_id: str
    device: Path


class SysfsSource:
    """AMD GPUs through the amdgpu driver's sysfs files, in PCI bus order (no per-process accounting)."""

    kind = "sysfs"

    def __init__(self, cards: list[_SysfsCard]) -> None:
        self._cards = cards

    @classmethod
    def open(cls, root: Path = Path("/sys")) -> SysfsSource | None:
        cards = []
        drm = root / "class" / "drm"
        with contextlib.suppress(OSError):
            for entry in sorted(drm.iterdir()):
                device = entry / "device"
                if not _CARD.fullmatch(entry.name) or not (device / "mem_info_vram_total").is_file():
                    continue
                with contextlib.suppress(OSError):
                    if (device / "vendor").read_text().strip().lower() != AMD_VENDOR:
                        continue
                bus = os.path.basename(os.path.realpath(device))
                cards.append(_SysfsCard(bus, device))
        if not cards:
            log.debug("no AMD GPU memory files under %s", drm)
            return None
        return cls(sorted(cards, key=lambda c: c.bus_id))

    def read(self) -> dict[int, GpuReading]:
        out = {}
        for index, card in enumerate(self._cards):
            total = int((card.device / "mem_info_vram_total").read_text().split()[0])
            used = int((card.device / "mem_info_vram_used").read_text().split()[0])
            name = ""
            with contextlib.suppress(OSError):
                name = (card.device / "product_name").read_text().strip()
            out[index] = GpuReading(
                index=index, total=total, used=used, name=name or "AMD GPU", bus_id=card.bus_id
            )
        return out

    def close(self) -> None:
        pass


def open_source(sysfs_root: Path = Path("/sys")) -> GpuSource | None:
    """The first reader that sees a GPU: NVML, then amdsmi, then sysfs; None on a host where none does."""
    for opener in (NvmlSource.open, AmdSmiSource.open, lambda: SysfsSource.open(sysfs_root)):
        source = opener()
        if source is not None:
            return source
    return None
