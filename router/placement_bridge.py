"""Placement for the running router and for ``python -m router plan``.

Reads every model's GGUF header, gathers GPU budgets (NVML, declared ``[devices.N]``, or host memory on a
machine without GPUs) and turns each model's plan into what the scheduler and the launcher need: the context
and layer count to start with, the bytes per GPU one replica takes, and the refusal text for a model that
can never fit. A file that is not a readable GGUF (a missing file, say) gets no prediction: it is started
with its configured context and its load reports the problem.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from .config import Config, ConfigError, load_config, resolve_gpus
from .launch import ModelDecision, default_decision, gpu_ids
from .llama_args import cache_types, flag_identity, merged_flags
from .placement.budgets import gather_budgets
from .placement.fit import ModelPlan, PlacementInput
from .placement.plan import format_plan_table, plan_document, plan_models

log = logging.getLogger("router.placement")
MIB = 1 << 20


def _flash_attn(config: Config, model_name: str) -> bool:
    model = config.models[model_name]
    for key, value in merged_flags(config.defaults, model.extra_args):
        if flag_identity(key) in ("flash-attn", "fa"):
            return value not in ("off", False, "false", "0")
    return True


def placement_inputs(config: Config, ids: tuple[int, ...]) -> list[PlacementInput]:
    inputs = []
    for name, model in config.models.items():
        k, v = cache_types(model, config.defaults)
        inputs.append(
            PlacementInput(
                name=name,
                path=model.path,
                gpus=resolve_gpus(model, ids),
                parallel=model.parallel,
                num_instance=model.num_instance,
                ctx=model.ctx,
                gpu_layers=model.gpu_layers,
                cache_type_k=k,
                cache_type_v=v,
                ctx_floor=config.router.ctx_floor,
                flash_attn=_flash_attn(config, name),
            )
        )
    return inputs


def _decision(config: Config, plan: ModelPlan) -> ModelDecision:
    model = config.models[plan.name]
    if plan.verdict == "refused":
        fallback = default_decision(model)
        return ModelDecision(fallback.ctx, fallback.gpu_layers, {}, plan.message)
    if plan.verdict == "error" or plan.ctx is None or plan.gpu_layers is None:
        log.warning("no memory prediction for %s: %s", plan.name, plan.message)
        return default_decision(model)
    return ModelDecision(
        plan.ctx, plan.gpu_layers, dict(plan.need_by_gpu), tensor_split=tuple(plan.tensor_split)
    )


def plan(
    config: Config,
) -> tuple[tuple[int, ...], dict[int, int | None], dict[str, ModelDecision], dict[str, Any]]:
    """GPU ids, their budgets (bytes), the decision per model, and the versioned plan document."""
    declared = {gpu: d.memory_mib for gpu, d in config.devices.items()}
    budgets = gather_budgets(declared, num_gpus=config.router.num_gpus)
    gpus = {device: b for device, b in budgets.items() if isinstance(device, int)}
    ids = gpu_ids(config, len(gpus))
    plans = plan_models(placement_inputs(config, ids), budgets, config.router.gpu_reserve_mib * MIB)
    decisions = {p.name: _decision(config, p) for p in plans}
    scheduler_budgets = {gpu: gpus[gpu].budget if gpu in gpus else None for gpu in ids}
    return ids, scheduler_budgets, decisions, plan_document(plans, budgets)


def plan_command(path: str | None, *, as_json: bool) -> int:
    if not path:
        print("no configuration: pass --config FILE or set ROUTER_CONFIG_PATH", file=sys.stderr)
        return 2
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cannot read config {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    *_, document = plan(config)
    print(json.dumps(document, indent=2) if as_json else format_plan_table(document))
    refused = [m["name"] for m in document["models"] if m["verdict"] == "refused"]
    return 1 if refused else 0
