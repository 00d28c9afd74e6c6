"""Models the scheduler places (``gpus = "any"``) in the running router's plan: their placement inputs, their
decisions (every GPU set with its need and layer split) and how the plan document explains them.

The arithmetic is ``router.placement.anywhere``; the choice at each load is ``statemachine.placement``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from router.config.load import ANY_GPUS, Config
from router.deploy.launch import ModelDecision
from router.placement.anywhere import Anywhere, fits, plan_anywhere
from router.placement.budgets import DeviceBudget
from router.placement.model_plan import Device, PlacementInput


def anywhere_inputs(
    config: Config,
    inputs: Sequence[PlacementInput],
    budgets: Mapping[Device, DeviceBudget | int | None],
    reserve: int,
    ids: Sequence[int],
) -> tuple[list[PlacementInput], dict[str, Anywhere]]:
    """The inputs to plan, each placed model's replaced by its first choice at the context decided for it
    (what the plan document shows and prompt caches are sized for), and each placed model's outcome."""
    bytes_by_device = {d: (b.budget if isinstance(b, DeviceBudget) else b) for d, b in budgets.items()}
    out: list[PlacementInput] = []
    placed: dict[str, Anywhere] = {}
    for inp in inputs:
        model = config.models[inp.name]
        if model.gpus != ANY_GPUS:
            out.append(inp)
            continue
        anywhere = plan_anywhere(inp, bytes_by_device, reserve, ids, model.gpus_max)
        placed[inp.name] = anywhere
        if anywhere.choices:
            inp = attrs.evolve(inp, gpus=anywhere.choices[0][0], ctx=anywhere.ctx, tensor_split=())
        out.append(inp)
    return out, placed


def anywhere_decision(
    decision: ModelDecision, anywhere: Anywhere, budgets: Mapping[int, int | None]
) -> ModelDecision:
    """The decision of a placed model: every set with its need (an operator's over-budget context counts as
    the whole GPU, as for a model with fixed GPUs) and layer split; refused when it fits no set."""
    if not anywhere.choices:
        return attrs.evolve(decision, refusal=anywhere.explanation, need={})
    choices = {}
    for gpus, plan in anywhere.choices:
        need = dict(plan.need_by_gpu)
        if plan.verdict == "override":
            for gpu, bytes_needed in need.items():
                budget = budgets.get(gpu)
                if budget is not None and bytes_needed * max(1, plan.num_instance) > budget:
                    need[gpu] = budget // max(1, plan.num_instance)
        choices[gpus] = (need, tuple(plan.tensor_split))
    return attrs.evolve(decision, need={}, tensor_split=(), choices=choices)


def explain_anywhere(document: dict[str, Any], placed: Mapping[str, Anywhere]) -> None:
    """Add to each placed model's entry of the plan document where the scheduler may put it and why
    (``placement``), and make that its message."""
    for entry in document["models"]:
        anywhere = placed.get(entry["name"])
        if anywhere is None:
            continue
        entry["placement"] = {
            "gpus": ANY_GPUS,
            "ctx": anywhere.ctx,
            "sets": [
                {
                    "gpus": list(gpus),
                    "need_by_gpu": {str(g): n for g, n in plan.need_by_gpu.items()},
                    "verdict": "fits" if fits(plan) else plan.verdict,
                }
                for gpus, plan in anywhere.choices
            ],
            "explanation": anywhere.explanation,
        }
        entry["message"] = f"{entry['name']}: {anywhere.explanation}"
        if not anywhere.choices:
            entry["verdict"] = "refused"
        elif all(fits(plan) for _, plan in anywhere.choices):
            entry["verdict"] = "fits"
