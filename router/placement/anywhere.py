"""Placement of a model the scheduler places (``gpus = "any"``): the GPU sets it may load on, one context.

The scheduler chooses a set at each load (``statemachine.placement``); placement gives it the sets and what a
replica needs on each. The context is decided once, so that every request is refused or accepted the same
wherever it lands:

- a configured ``ctx`` is kept; otherwise each set of the fewest GPUs that holds the model is planned with
  an automatic context, and the smallest of those contexts is taken, so that the model fits every one of
  them (a card too small even for ``ctx_floor`` is left out);
- with that context, every set of that many GPUs, and of one more (a fallback when pinned models hold the
  smaller ones), is planned again; the sets it fits are the choices, each with its own need and layer split.

A set is only ever one where the whole model fits on the GPUs (full offload): a model never spills to the CPU
because the scheduler chose a small card. A configured ``ctx`` that fits no set loads anyway on the fewest
GPUs (counted as taking all of each, as an operator's override does on fixed GPUs).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import attrs

from router.placement.fit import plan_model
from router.placement.model_plan import Device, ModelPlan, PlacementInput

GiB = 1 << 30
FITS = ("fits", "unknown-budget")


@attrs.frozen
class Anywhere:
    """The outcome for one model: the context, the plan of every set it may load on (fewest GPUs first),
    and the plan shown for the model (the first choice's; with no choice, the refusal on every GPU)."""

    ctx: int | None
    choices: tuple[tuple[tuple[int, ...], ModelPlan], ...]
    shown: ModelPlan
    explanation: str


def fits(plan: ModelPlan) -> bool:
    """Whether every layer fits within the budget of each GPU (an unknown budget: as placement assumes)."""
    if plan.verdict in FITS:
        return True
    if plan.verdict != "override":
        return False
    return all(r.total <= r.budget for r in plan.rows if isinstance(r.device, int) and r.budget is not None)


def _on(inp: PlacementInput, gpus: tuple[int, ...], ctx: int | None) -> PlacementInput:
    names = {d: n for d, n in inp.device_names.items() if d in gpus}
    return attrs.evolve(inp, gpus=gpus, ctx=ctx, tensor_split=(), device_names=names)


def plan_anywhere(
    inp: PlacementInput,
    budgets: Mapping[Device, int | None],
    reserve: int,
    ids: Sequence[int],
    gpus_max: int | None,
) -> Anywhere:
    """Plan ``inp`` (its ``gpus`` ignored) on the sets of ``ids`` of at most ``gpus_max`` GPUs."""
    largest = min(len(ids), gpus_max or len(ids))
    ctx = inp.ctx
    size = 0
    for size in range(1, largest + 1):
        sets = itertools.combinations(ids, size)
        tried = [plan_model(_on(inp, s, inp.ctx), budgets, reserve) for s in sets]
        fitting = [p for p in tried if fits(p)] or [p for p in tried if p.ok and inp.ctx is not None]
        if fitting:
            if ctx is None:
                ctx = min(p.ctx for p in fitting if p.ctx is not None)
            break
    else:
        whole = plan_model(_on(inp, tuple(ids[:largest]), inp.ctx), budgets, reserve)
        why = (
            f"{inp.name} fits no set of at most {largest} GPU(s) of {_gpu_list(ids)}: {whole.message}"
            if ids
            else f"{inp.name}: there is no GPU to place it on"
        )
        return Anywhere(None, (), whole, why)
    plans = {
        s: plan_model(_on(inp, s, ctx), budgets, reserve)
        for n in range(size, min(size + 1, largest) + 1)
        for s in itertools.combinations(ids, n)
    }
    good = [s for s, p in plans.items() if fits(p)]
    if not good and inp.ctx is not None:
        good = [s for s, p in plans.items() if p.ok]  # the operator's context loads anyway, as on fixed GPUs
    choices = tuple((s, plans[s]) for s in good)
    left = [s for s in plans if s not in good and len(s) == size]
    return Anywhere(ctx, choices, choices[0][1], _explain(inp, ctx, choices, left, size))


def _gpu_list(ids: Sequence[int]) -> str:
    return ", ".join(f"GPU {g}" for g in ids)


def _explain(
    inp: PlacementInput,
    ctx: int | None,
    choices: Sequence[tuple[tuple[int, ...], ModelPlan]],
    left: Sequence[tuple[int, ...]],
    size: int,
) -> str:
    """Where the scheduler may put the model, and why the other sets are out, in one paragraph."""
    where = "; ".join(f"{_named(s)} ({_need(p)})" for s, p in choices if len(s) == size)
    unit = "one GPU" if size == 1 else f"{size} GPUs"
    text = f"placed by the scheduler at each load on {unit}: {where}"
    if inp.ctx is None and ctx is not None:
        text += f"; ctx {ctx} is the largest that fits every one of them"
    fallback = [s for s, _ in choices if len(s) > size]
    if fallback:
        text += f"; {len(fallback)} set(s) of {size + 1} GPUs when those are held by pinned models"
    if left:
        text += "; not on " + ", ".join(_named(s) for s in left) + " (too small)"
    return text


def _named(gpus: tuple[int, ...]) -> str:
    return " + ".join(f"GPU {g}" for g in gpus)


def _need(plan: ModelPlan) -> str:
    parts = []
    for row in plan.rows:
        if isinstance(row.device, int) and row.budget is not None:
            parts.append(f"{row.total / GiB:.1f} of {row.budget / GiB:.1f} GiB")
        elif isinstance(row.device, int):
            parts.append(f"{row.total / GiB:.1f} GiB")
    return ", ".join(parts)
