"""A deployment: everything decided from one configuration before the router uses it.

``prepare(config)`` locates llama-server (and the binaries models name of their own), plans placement, builds
the scheduler's settings and the launch recipe of every model, and refuses what cannot work (a model's
binary that is missing or whose ``--help`` lists no flags, a model file that cannot be read, a pass-through
key that is no flag of the llama-server that gets it, unknown GPU ids, pinned models that cannot all stay
resident).
Startup uses it once; a reload uses it again for the new file and swaps only when it succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from router.config.load import Config, check_gpu_ids, check_model_files, read_api_keys
from router.deploy.bridge import hosted_plan
from router.deploy.launch import ModelLaunch, check_pinned, launches, scheduler_settings
from router.deploy.masking import Masks
from router.hosts.gpu_monitor import GpuMonitor, Ours
from router.hosts.locate import find_llama_server
from router.hosts.model_binaries import model_binaries
from router.hosts.server_flags import accepted_flags, check_flags
from statemachine import Settings

log = logging.getLogger("router")


@attrs.frozen
class Deployment:
    config: Config
    settings: Settings
    launches: Mapping[str, ModelLaunch]
    plan_document: Mapping[str, Any]
    api_keys: tuple[bytes, ...]
    slot_saves: bool = True  # the binary takes --slot-save-path (unknown: assumed)
    masks: Masks = attrs.field(factory=Masks)  # a Vulkan or SYCL build's devices per GPU id


def prepare(config: Config, monitor: GpuMonitor | None = None, ours: Ours | None = None) -> Deployment:
    """Everything decided from ``config``; ``monitor`` and ``ours`` as for
    :func:`router.deploy.bridge.plan` (a reload passes the running router's, so that its own replicas
    do not count against the budgets)."""
    binary = find_llama_server(config.router.llama_server)
    own = model_binaries(config)
    accepted = accepted_flags(binary)
    check_flags(config, binary, accepted, own)
    check_model_files(config)
    host, ids, budgets, decisions, document = hosted_plan(config, monitor, ours)
    config = host.config
    check_gpu_ids(config, ids)
    settings = scheduler_settings(config, ids, decisions, budgets)
    check_pinned(config, settings)
    for name, decision in decisions.items():
        if decision.refusal:
            log.error("model %s cannot be served: %s", name, decision.refusal)
    keys = tuple(key.encode() for key in read_api_keys(config))
    slot_saves = accepted is None or "--slot-save-path" in accepted
    binaries = {name: str(path) for name, (path, _) in own.items()}
    built = launches(config, str(binary), ids, decisions, binaries, host.binary_masks)
    return Deployment(config, settings, built, document, keys, slot_saves, host.masks)


def changed_models(old: Deployment, new: Deployment) -> frozenset[str]:
    """Models whose running replicas no longer match the new deployment (removed, or started differently:
    another command line, other GPUs, slots or replicas, another ``env``)."""
    changed = set()
    for name, launch in old.launches.items():
        fresh = new.launches.get(name)
        if fresh is None or fresh.argv(0) != launch.argv(0) or fresh.gpus != launch.gpus:
            changed.add(name)
            continue
        if (fresh.model.env, fresh.masks) != (launch.model.env, launch.masks):
            changed.add(name)  # its env, or the device masks of its own binary
            continue
        before, after = old.settings.models[name], new.settings.models[name]
        if (before.slots, before.replicas) != (after.slots, after.replicas):
            changed.add(name)
    return frozenset(changed)
