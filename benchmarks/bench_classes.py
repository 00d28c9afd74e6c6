"""Who is served first, measured on the scheduler itself with a simulated clock (no I/O, exact figures).

1. A person among agents: one single-slot model; 8 batch keys have queued 25 requests each; a person's
   interactive request arrives at a random moment while one request is in flight. Every request takes
   ``service`` seconds. Its wait is measured over ``repeats`` random arrival moments, with classes and
   with the same workload in strict arrival order (everyone standard, one key): p50 and p95 in seconds,
   and the ratio.
2. Fair share: keys of weights 2 and 1 each queue 60 requests for one single-slot model; of the first 60
   dispatches, how many each got (2:1 is 40:20).

Prints a table and writes outputs/benchmark-classes.json.

    python benchmarks/bench_classes.py [--repeats 200] [--service 2.0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from statemachine import (  # noqa: E402
    Dispatch,
    Event,
    ModelSpec,
    ReplicaReady,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
    State,
    Tick,
    initial_state,
    step,
)


class Sim:
    """One single-slot model and a clock: requests run ``service`` seconds each, one at a time."""

    def __init__(self, weights: dict[str, int] | None = None) -> None:
        self.settings = Settings(models=[ModelSpec("m", pinned=True)], weights=weights or {})
        self.state: State = initial_state(self.settings)
        self.now = 0.0
        self.running: int | None = None
        self.started: dict[int, float] = {}
        for command in self.feed(Startup()):
            if isinstance(command, Spawn):
                self.feed(ReplicaReady(command.replica))

    def feed(self, event: Event) -> tuple[object, ...]:
        self.state, commands = step(self.state, event)
        for command in commands:
            if isinstance(command, Dispatch):
                self.running = command.rid
                self.started[command.rid] = self.now
        return commands

    def at(self, when: float) -> None:
        self.now = when
        self.feed(Tick(when))

    def finish(self, when: float) -> None:
        self.at(when)
        assert self.running is not None
        rid, self.running = self.running, None
        self.feed(RequestFinished(rid))


def person_wait(classes: bool, service: float, rng: random.Random) -> float:
    sim = Sim()
    rid = 0
    for key in range(8):
        for _ in range(25):
            rid += 1
            klass = RequestClass.BATCH if classes else RequestClass.STANDARD
            sim.feed(RequestArrived(rid, "m", key=f"agent{key}" if classes else "", klass=klass))
    arrives = rng.uniform(0.0, service)  # while the first request is in flight
    sim.at(arrives)
    person = rid + 1
    klass = RequestClass.INTERACTIVE if classes else RequestClass.STANDARD
    sim.feed(RequestArrived(person, "m", key="person" if classes else "", klass=klass))
    finish = service
    while person not in sim.started:
        sim.finish(finish)
        finish += service
    return sim.started[person] - arrives


def fair_share() -> dict[str, int]:
    sim = Sim(weights={"two": 2, "one": 1})
    keys: dict[int, str] = {}
    rid = 0
    for _ in range(60):
        for key in ("two", "one"):
            rid += 1
            keys[rid] = key
            sim.feed(RequestArrived(rid, "m", key=key))
    counts = {"two": 0, "one": 0}
    clock = 0.0
    for _ in range(60):
        assert sim.running is not None
        counts[keys[sim.running]] += 1
        clock += 1.0
        sim.finish(clock)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--service", type=float, default=2.0, help="seconds one request runs")
    parser.add_argument("--out", default=str(ROOT / "outputs" / "benchmark-classes.json"))
    args = parser.parse_args()
    rng = random.Random(11)
    rows = {}
    for name, classes in (("classes", True), ("arrival order", False)):
        waits = [person_wait(classes, args.service, rng) for _ in range(args.repeats)]
        rows[name] = {
            "p50_s": round(statistics.median(waits), 3),
            "p95_s": round(statistics.quantiles(waits, n=20)[-1], 3),
            "max_s": round(max(waits), 3),
        }
    share = fair_share()
    ratio = rows["arrival order"]["p50_s"] / max(rows["classes"]["p50_s"], 1e-9)
    print(f"person's wait behind 8 x 25 batch requests ({args.service:g} s each, {args.repeats} repeats)")
    for name, row in rows.items():
        print(f"  {name:<14} p50 {row['p50_s']:>8} s  p95 {row['p95_s']:>8} s  max {row['max_s']:>8} s")
    print(f"  arrival order / classes (p50): {ratio:.0f}x")
    print(f"fair share, weights 2:1, first 60 dispatches: {share['two']}:{share['one']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "classes",
        "service_s": args.service,
        "repeats": args.repeats,
        "person_wait": rows,
        "p50_ratio": round(ratio, 1),
        "fair_share_first_60": share,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
