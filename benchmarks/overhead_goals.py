"""The goals bench_overhead.py checks, each from figures measured side by side in the same run.

A goal whose figures are missing (a target left out, a phase not run) is reported as not measured, never as
met.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class Goal:
    name: str
    wanted: str
    value: float | None
    met: bool | None  # None: not measured

    def row(self, fmt: Callable[[float], str]) -> list[Any]:
        shown = "-" if self.value is None else fmt(self.value)
        verdict = "not measured" if self.met is None else ("met" if self.met else "NOT met")
        return [self.name, self.wanted, shown, verdict]


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def _diff_ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else 1000.0 * (a - b)


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _check(value: float | None, test: Callable[[float], bool]) -> bool | None:
    return None if value is None else test(value)


def evaluate(result: dict[str, Any], stream_level: int) -> list[tuple[Goal, str]]:
    """The goals and how to show each value ("ms", "x", "s", "%", "n")."""
    small = result.get("small", {})
    streams = result.get("streams", {})
    goals: list[tuple[Goal, str]] = []

    def add(name: str, wanted: str, value: float | None, met: bool | None, kind: str) -> None:
        goals.append((Goal(name, wanted, value, met), kind))

    def lat(key: str, q: str) -> float | None:
        return _get(small, key, "latency_s", q)

    added50 = _diff_ms(lat("router", "p50"), lat("direct", "p50"))
    lcpp50 = _diff_ms(lat("llamacpp", "p50"), lat("direct", "p50"))
    add("added latency p50", "<= 1.0 ms", added50, _check(added50, lambda v: v <= 1.0), "ms")
    below = None if added50 is None or lcpp50 is None else added50 < lcpp50
    add("added latency p50 vs router mode", "below router mode's", added50, below, "ms")
    mine99, theirs99 = lat("router", "p99"), lat("llamacpp", "p99")
    p99_ok = None if mine99 is None or theirs99 is None else mine99 <= theirs99
    add("latency p99 vs router mode", "<= router mode's", _diff_ms(mine99, theirs99), p99_ok, "ms")
    ttft = _diff_ms(_get(streams, "router", "ttft_s", "p50"), _get(streams, "direct", "ttft_s", "p50"))
    add("time to first token", "<= direct + 1.0 ms", ttft, _check(ttft, lambda v: v <= 1.0), "ms")
    rate = _div(
        _get(streams, "router", "chunk_rate_per_s", "p50"), _get(streams, "direct", "chunk_rate_per_s", "p50")
    )
    add("single-stream chunk rate", ">= 0.97x direct", rate, _check(rate, lambda v: v >= 0.97), "x")
    level = _get(result, "concurrent", str(stream_level))
    aggregate = _div(_get(level, "router", "chunks_per_s"), _get(level, "direct", "chunks_per_s"))
    name = f"{stream_level} concurrent streams, aggregate"
    add(name, ">= 0.95x direct", aggregate, _check(aggregate, lambda v: v >= 0.95), "x")
    concurrent = result.get("concurrent") or {}
    cpus = [_get(v, "router", "cpu_s_per_1000_chunks") for v in concurrent.values()]
    measured = [c for c in cpus if c is not None]
    worst = max(measured) if measured else None
    add("router CPU per 1,000 chunks", "<= 0.04 s", worst, _check(worst, lambda v: v <= 0.04), "s")
    swaps = result.get("swaps", {})
    swap = _div(_get(swaps, "router", "total_s", "p50"), _get(swaps, "llamacpp", "total_s", "p50"))
    swap_ok = None if swap is None else swap <= 1.0 and not _get(swaps, "router", "failures")
    add("A->B->A swap vs router mode", "<= 1.0x, none failed", swap, swap_ok, "x")
    crowd = result.get("crowd")
    if crowd:
        everyone = crowd["answered"] == crowd["clients"]
        add(
            f"{crowd['clients']} clients at once", "all answered 200", float(crowd["answered"]), everyone, "n"
        )
        for what in ("rss", "fds"):
            growth = crowd.get(f"{what}_growth")
            within = _check(growth, lambda v: abs(v) <= 0.10 + 1e-9)  # 22 of 20 is within
            add(f"router {what} after the crowd", "within 10 % of before", growth, within, "%")
    return goals


FORMATS: dict[str, Callable[[float], str]] = {
    "ms": lambda v: f"{v:+.2f} ms",
    "x": lambda v: f"{v:.3f}x",
    "s": lambda v: f"{v:.4f} s",
    "%": lambda v: f"{100 * v:+.1f} %",
    "n": lambda v: f"{v:.0f}",
}


def goal_rows(goals: list[tuple[Goal, str]]) -> list[list[Any]]:
    return [goal.row(FORMATS[kind]) for goal, kind in goals]


def goals_document(goals: list[tuple[Goal, str]]) -> list[dict[str, Any]]:
    return [attrs.asdict(goal) for goal, _ in goals]
