"""A host with no GPU at all: the models that name no GPUs run on the CPU, with no ``num_gpus = 0`` needed.

The host has no GPU when the router's readers (NVML, amdsmi, the amdgpu sysfs files) find none, the config
declares no ``[devices.N]`` and sets no ``num_gpus``, and the llama-server build lists no device either
(``--list-devices``: a Metal or Vulkan GPU has no reader of ours but the build sees it). Then every model
whose ``gpus`` nobody set (neither its table nor ``[defaults]``) is planned and run as ``gpus = []`` would
be: against the host's memory, with ``-ngl 0`` and no GPU visible. A model that names GPUs keeps its rule
(every layer on them, never a silent ``-ngl 0``), and is told about in the same log line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs

from router.config.load import ANY_GPUS, Config
from router.deploy.masking import has_backend_libraries
from router.hosts.locate import LlamaServerNotFound, find_llama_server
from router.hosts.server_devices import listed_devices

log = logging.getLogger("router")
_told: set[tuple[str, ...]] = set()  # the log line is written once per set of models moved


def build_devices(config: Config, gpus_found: bool) -> tuple[Path | None, tuple[str, ...] | None]:
    """The llama-server binary and what its ``--list-devices`` lists, when that is worth asking: no GPU was
    read (is there one the build sees?), or a Vulkan or SYCL backend sits beside the build (which of its
    devices is which GPU: ``router.deploy.masking``). (binary or None, None) otherwise."""
    try:
        binary = find_llama_server(config.router.llama_server)
    except LlamaServerNotFound:
        return None, None
    if gpus_found and not has_backend_libraries(binary):
        return binary, None
    return binary, listed_devices(binary)


def on_cpu_host(config: Config, binary: Path | None, listed: tuple[str, ...] | None) -> Config:
    """``config`` with the models that name no GPUs on the CPU, when this host has no GPU (see the module
    doc: ``listed`` is what ``binary`` lists); ``config`` itself otherwise. Called only when no GPU was
    read."""
    unnamed = [
        m.name for m in config.models.values() if (not m.gpus_named and m.gpus != ()) or m.gpus == ANY_GPUS
    ]
    if config.router.num_gpus is not None or config.devices or not unnamed or listed != ():
        return config
    key = tuple(unnamed)
    if key not in _told:
        _told.add(key)
        named = [m.name for m in config.models.values() if m.name not in key and m.gpus != ()]
        also = f"; {', '.join(named)} name GPUs and keep them (every layer offloaded)" if named else ""
        log.warning(
            "no GPU found (no NVML, amdsmi or sysfs reading, no [devices.N], and %s lists no device): "
            "%s run on the CPU, planned against the host's memory%s. Set gpus on a model or declare "
            "[devices.N] memory_mib to use a GPU the router cannot see",
            binary,
            ", ".join(unnamed),
            also,
        )
    models = {
        name: attrs.evolve(model, gpus=()) if name in key else model for name, model in config.models.items()
    }
    return attrs.evolve(config, models=models)
