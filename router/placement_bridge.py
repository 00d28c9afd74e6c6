"""Placement for the running router and for ``python -m router plan`` (filled in by the placement step)."""

from __future__ import annotations

from .config import Config
from .launch import ModelDecision, default_decision

MIB = 1024 * 1024


def decide(config: Config) -> tuple[int, dict[int, int | None], dict[str, ModelDecision]]:
    budgets: dict[int, int | None] = {
        gpu: (d.memory_mib * MIB if d.memory_mib is not None else None) for gpu, d in config.devices.items()
    }
    decisions = {name: default_decision(model) for name, model in config.models.items()}
    return 0, budgets, decisions


def plan_command(path: str | None, *, as_json: bool) -> int:
    print("plan: not available yet")
    return 1
