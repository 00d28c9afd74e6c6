"""Which devices of a Vulkan or SYCL build each GPU of the router is, so that a replica sees only its own.

CUDA and ROCm builds are masked by ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` with the router's own
GPU ids (NVML's PCI bus order). A Vulkan build numbers its devices its own way — an integrated GPU may come
first — and reads ``GGML_VK_VISIBLE_DEVICES``; a SYCL build reads ``ONEAPI_DEVICE_SELECTOR``
(``level_zero:N``). The build's own list (``llama-server --list-devices``: ``Vulkan1: NVIDIA GeForce RTX 3090
(24576 MiB, 23000 MiB free)``) says which is which: each GPU the router reads is matched, in id order, to the
first unused device of that backend with the same name and, when both are known, a total within 10 %. Where
the router reads no GPU, GPU N is the backend's device N. A GPU without a match gets no mask of that backend
(the replica sees all its devices), and the log says so.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from router.placement.budgets import DeviceBudget

log = logging.getLogger("router")

BACKENDS = {"Vulkan": "GGML_VK_VISIBLE_DEVICES", "SYCL": "ONEAPI_DEVICE_SELECTOR"}
# Shared libraries beside a build (or in ../lib) that say it has these backends.
_LIBRARIES = {"Vulkan": "libggml-vulkan", "SYCL": "libggml-sycl"}
_LINE = re.compile(r"^(?P<backend>[A-Za-z]+)(?P<index>\d+): (?P<name>.*?)(?: \((?P<mib>\d+) MiB\b.*\))?$")


@attrs.frozen
class BackendDevice:
    backend: str  # "Vulkan", "SYCL", "CUDA", ...
    index: int  # the backend's own number
    name: str
    total_mib: int | None


@attrs.frozen
class Masks:
    """Per backend with a variable of its own, each router GPU id's device number in that backend."""

    by_backend: Mapping[str, Mapping[int, int]] = attrs.field(factory=dict)

    def env(self, gpus: Sequence[int]) -> dict[str, str]:
        """The variables that show a replica on ``gpus`` only its own devices (none for a CPU replica, and
        none of a backend that misses one of them)."""
        out = {}
        for backend, numbers in self.by_backend.items():
            if gpus and all(g in numbers for g in gpus):
                listed = ",".join(str(numbers[g]) for g in gpus)
                out[BACKENDS[backend]] = f"level_zero:{listed}" if backend == "SYCL" else listed
        return out


def backend_devices(listed: Sequence[str]) -> list[BackendDevice]:
    """The devices of a ``--list-devices`` list (its lines, as ``server_devices.parse_devices`` gives)."""
    out = []
    for line in listed:
        found = _LINE.match(line.strip())
        if found is not None:
            mib = found.group("mib")
            out.append(
                BackendDevice(
                    found.group("backend"),
                    int(found.group("index")),
                    found.group("name").strip(),
                    int(mib) if mib else None,
                )
            )
    return out


def has_backend_libraries(binary: Path) -> bool:
    """Whether a Vulkan or SYCL backend library sits beside ``binary`` or in ``../lib`` (then the build's
    device list is worth its start-up time)."""
    for folder in (binary.parent, binary.parent.parent / "lib"):
        try:
            names = [p.name for p in folder.iterdir()]
        except OSError:
            continue
        if any(n.startswith(lib) for n in names for lib in _LIBRARIES.values()):
            return True
    return False


def _same(gpu: DeviceBudget, device: BackendDevice) -> bool:
    if " ".join(gpu.name.lower().split()) != " ".join(device.name.lower().split()):
        return False
    if gpu.total is None or device.total_mib is None:
        return True
    return abs(gpu.total / (1 << 20) - device.total_mib) <= 0.1 * device.total_mib


def device_masks(listed: Sequence[str], gpus: Mapping[int, DeviceBudget], ids: Sequence[int]) -> Masks:
    """The masks of the Vulkan and SYCL devices a build lists, for the router's GPU ``ids`` (``gpus``: the
    readings, where there are any)."""
    devices = backend_devices(listed)
    by_backend: dict[str, dict[int, int]] = {}
    for backend in BACKENDS:
        mine = [d for d in devices if d.backend == backend]
        if not mine:
            continue
        numbers: dict[int, int] = {}
        named = {g: gpus[g] for g in ids if g in gpus and gpus[g].name}
        if not named:
            numbers = {g: d.index for g, d in zip(ids, mine, strict=False)}
        else:
            free = list(mine)
            for gpu, reading in sorted(named.items()):
                match = next((d for d in free if _same(reading, d)), None)
                if match is None:
                    log.warning(
                        "GPU %d (%s) is none of the %s devices llama-server lists (%s): its replicas see "
                        "every %s device",
                        gpu,
                        reading.name,
                        backend,
                        "; ".join(f"{d.index}: {d.name}" for d in mine),
                        backend,
                    )
                    continue
                free.remove(match)
                numbers[gpu] = match.index
        by_backend[backend] = numbers
    return Masks(by_backend)
