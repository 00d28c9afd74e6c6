"""Placement for the running router and for ``python -m router plan``.

Reads every model's GGUF header, gathers GPU budgets (NVML, declared ``[devices.N]``) and the host's memory
(the budget of models without a GPU, and what prompt caches are sized against) and turns each model's plan
into what the scheduler and the launcher need: the context and layer count to start with, the bytes per GPU
one replica takes, the prompt-cache MiB, and the refusal text for a model that can never fit. A file that
is not a readable GGUF gets no prediction: it is started with its configured context and its load reports
the problem (a missing or unreadable file never gets this far when the router runs:
``router.config.load.check_model_files`` refuses the configuration; ``plan`` reports it as an error).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from router.config.llama_args import cache_types
from router.config.load import Config, ConfigError, config_dir, resolve_gpus
from router.config.source import ConfigSource
from router.deploy.anywhere import anywhere_decision, anywhere_inputs, explain_anywhere
from router.deploy.cpu_host import build_devices, on_cpu_host
from router.deploy.launch import ModelDecision, default_decision, gpu_ids
from router.deploy.masking import Masks, device_masks, has_backend_libraries
from router.deploy.memory_flags import flash_attn, memory_flags
from router.deploy.rpc_devices import model_devices, rpc_devices
from router.hosts.gpu_monitor import GpuMonitor, Ours
from router.hosts.model_binaries import usable_binary
from router.hosts.server_devices import listed_devices
from router.placement.budgets import DeviceBudget, gather_budgets, host_budget
from router.placement.footprint import CPU
from router.placement.model_plan import ModelPlan, PlacementInput
from router.placement.plan import format_plan_table, plan_document, plan_models

log = logging.getLogger("router.placement")
MIB = 1 << 20


def _flash_attn(config: Config, model_name: str) -> bool:
    """Whether the model's replicas run with flash attention (``router.deploy.memory_flags.flash_attn``)."""
    return flash_attn(config.defaults, config.models[model_name].extra_args)


def placement_inputs(config: Config, ids: tuple[int, ...]) -> list[PlacementInput]:
    """One placement input per model, with every llama-server flag that moves memory read from ``[defaults]``
    and the model's table (``router.deploy.memory_flags``). Relative ``mmproj`` and ``model-draft`` paths
    start from the config file's folder, like ``model``."""
    base_dir = config_dir(config)
    names = {d.id: d.label for d in rpc_devices(config)}
    inputs = []
    for name, model in config.models.items():
        k, v = cache_types(model, config.defaults)
        gpus = model_devices(config, model, resolve_gpus(model, ids))  # RPC devices first, as llama.cpp
        flags = memory_flags(config.defaults, model.extra_args, n_gpus=len(gpus), base_dir=base_dir)
        inputs.append(
            PlacementInput(
                name=name,
                path=model.path,
                gpus=gpus,
                parallel=model.parallel,
                num_instance=model.num_instance,
                ctx=model.ctx,
                gpu_layers=model.gpu_layers,
                cache_type_k=k,
                cache_type_v=v,
                ctx_floor=config.router.ctx_floor,
                ctx_default=config.router.ctx_default,
                cram=model.cram,
                device_names={d: names[d] for d in gpus if d in names},
                **flags.as_kwargs(),
            )
        )
    return inputs


def _decision(config: Config, plan: ModelPlan, budgets: Mapping[int, int | None]) -> ModelDecision:
    model = config.models[plan.name]
    if plan.verdict == "refused":
        fallback = default_decision(model)
        return ModelDecision(
            fallback.ctx,
            fallback.gpu_layers,
            {},
            plan.message,
            cram_mib=fallback.cram_mib if plan.cram_mib is None else plan.cram_mib,
        )
    if plan.verdict == "error" or plan.ctx is None or plan.gpu_layers is None:
        log.warning("no memory prediction for %s: %s", plan.name, plan.message)
        fallback = default_decision(model)
        return attrs.evolve(
            fallback, cram_mib=plan.cram_mib if plan.cram_mib is not None else fallback.cram_mib
        )
    need = dict(plan.need_by_gpu)
    if plan.verdict == "override":
        # An operator's setting loads even when predicted over budget: the scheduler counts it as taking
        # the whole GPU (never more), so it can always be loaded once the other residents have left.
        for gpu, bytes_needed in need.items():
            budget = budgets.get(gpu)
            if budget is not None and bytes_needed * max(1, plan.num_instance) > budget:
                need[gpu] = budget // max(1, plan.num_instance)
    return ModelDecision(
        plan.ctx, plan.gpu_layers, need, tensor_split=tuple(plan.tensor_split), cram_mib=plan.cram_mib
    )


def plan(
    config: Config, monitor: GpuMonitor | None = None, ours: Ours | None = None
) -> tuple[tuple[int, ...], dict[int, int | None], dict[str, ModelDecision], dict[str, Any]]:
    """GPU ids, the budgets (bytes) of the GPUs and RPC devices, the decision per model, and the versioned
    plan document (see ``hosted_plan``)."""
    return hosted_plan(config, monitor, ours)[1:]


@attrs.frozen
class Host:
    """The configuration as this host runs it (on a host without GPUs, the models that name none are on the
    CPU: ``router.deploy.cpu_host``) and the masks of a Vulkan or SYCL build's devices
    (``router.deploy.masking``): the router's binary's, and those of each other binary a model names
    (``binary_masks``, by path)."""

    config: Config
    masks: Masks = attrs.field(factory=Masks)
    binary_masks: Mapping[str, Masks] = attrs.field(factory=dict)


def binary_masks(
    config: Config, router_binary: Path | None, gpus: Mapping[int, DeviceBudget], ids: tuple[int, ...]
) -> dict[str, Masks]:
    """The device masks of every binary a model names besides the router's, asked (``--list-devices``) on
    the same terms as the router's own: no GPU was read, or a Vulkan or SYCL backend sits beside it."""
    out: dict[str, Masks] = {}
    for model in config.models.values():
        binary = usable_binary(model)
        if binary is None or binary == router_binary or str(binary) in out:
            continue
        listed = listed_devices(binary) if not gpus or has_backend_libraries(binary) else None
        out[str(binary)] = device_masks(listed or (), gpus, ids)
    return out


def hosted_plan(
    config: Config, monitor: GpuMonitor | None = None, ours: Ours | None = None
) -> tuple[Host, tuple[int, ...], dict[int, int | None], dict[str, ModelDecision], dict[str, Any]]:
    """The host's view of ``config`` (``Host``), GPU ids, the budgets (bytes) of the GPUs and RPC devices,
    the decision per model, and the versioned plan document.

    ``monitor`` reads the GPUs (a fresh one when None); ``ours`` tells it which processes on each GPU are
    this router's replicas, so that a plan made while they run (a reload) sees the same budgets.
    """
    declared = {gpu: d.memory_mib for gpu, d in config.devices.items()}
    own = monitor is None
    monitor = monitor or GpuMonitor()
    try:
        budgets = gather_budgets(
            declared, num_gpus=config.router.num_gpus, measured=lambda: monitor.budgets(ours)
        )
    finally:
        if own:
            monitor.close()
    gpus = {device: b for device, b in budgets.items() if isinstance(device, int)}
    binary, listed = build_devices(config, bool(gpus))
    if not gpus:
        config = on_cpu_host(config, binary, listed)
    ids = gpu_ids(config, len(gpus))
    masks = device_masks(listed or (), gpus, ids)
    inputs = placement_inputs(config, ids)
    for rpc in rpc_devices(config):
        budgets[rpc.id] = DeviceBudget(device=rpc.id, name=rpc.label, declared=rpc.budget, kind="rpc")
    budgets[CPU] = host_budget()  # CPU-only models are planned against it; prompt caches live there
    reserve = config.router.gpu_reserve_mib * MIB
    inputs, placed = anywhere_inputs(config, inputs, budgets, reserve, ids)
    plans = plan_models(inputs, budgets, reserve)
    scheduler_budgets = {gpu: gpus[gpu].budget if gpu in gpus else None for gpu in ids}
    scheduler_budgets.update({rpc.id: rpc.budget for rpc in rpc_devices(config)})
    decisions = {p.name: _decision(config, p, scheduler_budgets) for p in plans}
    for name, anywhere in placed.items():
        decisions[name] = anywhere_decision(decisions[name], anywhere, scheduler_budgets)
    used = {gpu for inp in inputs for gpu in inp.gpus if gpu in ids}
    for gpu in sorted(used):
        if scheduler_budgets.get(gpu) is None:
            log.warning(
                "GPU %d: its memory cannot be read (no NVML, amdsmi or sysfs reading) and no "
                "[devices.%d] memory_mib is declared: its models are fully offloaded with ctx_default "
                "(%d) unless they set ctx; declare memory_mib to plan against the GPU's real size",
                gpu,
                gpu,
                config.router.ctx_default,
            )
    document = plan_document(plans, budgets)
    explain_anywhere(document, placed)
    if document["host"]["warning"]:
        log.warning("%s", document["host"]["warning"])
    host = Host(config, masks, binary_masks(config, binary, gpus, ids))
    return host, ids, scheduler_budgets, decisions, document


def plan_command(source: ConfigSource, *, as_json: bool) -> int:
    try:
        config = source.load()
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    *_, document = plan(config)
    print(json.dumps(document, indent=2) if as_json else format_plan_table(document))
    refused = [m["name"] for m in document["models"] if m["verdict"] in ("refused", "error")]
    return 1 if refused else 0
