"""Six models on four cards: placed by the scheduler (``gpus = "any"``) against every fixed assignment,
measured on the scheduler itself with a simulated clock (no I/O, exact figures).

Four 12 GiB cards (GPUs 0-3) and six models of 7 to 9 GiB; the default policy, so one model per card. A
homelab's workload, the same for every run: a few closed-loop agents (by default four: a coding agent, a
person chatting, a tool agent and a person writing; ``--agents`` up to six), each working on one model for a
while and now and then switching to another. Everything is drawn from a fixed seed (``random.Random(seed)``)
before any run:

- each agent sends ``--requests`` requests; after each reply it thinks (an exponential time of its own mean,
  1 to 45 s) before the next; a request runs a random time in the agent's own range;
- after each request an agent switches model with its own probability (5 to 20 %), to another of the six
  drawn by popularity (the smaller models a little more popular than the bigger ones).

A load takes ``--load`` seconds, a stop half a second (as in bench_swaps.py). The workload runs under:

- ``any``: every model placed by the scheduler at each load, its choices each single card it fits;
- every fixed assignment of the six models to the cards, each model bound to one card. On identical cards an
  assignment and its relabellings (the same groups of models on other cards) behave alike, so one of each
  is run: the set partitions of the six models into at most four groups (187), standing for all 4^6 = 4096
  raw assignments (each weighs as many as it stands for). With ``--cards`` of different sizes every raw
  assignment where each model fits its card is run (1024 for 24,12,8,8: slower, use fewer ``--requests``).

Swaps are loads beyond the first load of each model (a model's first load is paid whatever the placement).
For ``any`` it reports swaps, swaps per 100 requests, p50/p95/max wait (arrival to dispatch), the total time,
the cards used and the card each model went to at its first load; for the fixed assignments the best
(fewest swaps), the median (over the raw assignments) and the worst, and how many have no more swaps than
``any`` (goal: none). The best fixed assignment is picked in hindsight, knowing the whole workload: with few
requests it can fit them (a few switches are easy to keep apart), hence 100 requests per agent. ``--seed
1-8`` runs several workloads and adds a table of them; ``--sizes`` sets the six models' sizes.

Prints Markdown tables and writes outputs/benchmark-placement.json.

    python benchmarks/bench_placement.py [--requests|-n 100] [--agents 4] [--seed 1|1,2|1-8] [--load 10]
                                         [--cards 12,12,12,12] [--sizes 7,7.5,8,8,8.5,9]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.closed_loop import ClosedLoop
from benchmarks.results import percentile, print_table, write_result
from statemachine import DeviceSpec, ModelSpec, Placement, Policy, Settings

GIB = 1 << 30
# The six models: name -> GiB one replica takes, and how often an agent switching model picks it.
MODELS = {"a": 7.0, "b": 7.5, "c": 8.0, "d": 8.0, "e": 8.5, "f": 9.0}
POPULARITY = {"a": 3, "b": 3, "c": 2, "d": 2, "e": 2, "f": 1}


class Agent(NamedTuple):
    """How one agent works: mean think time, the range of its request times and its chance of switching."""

    name: str
    think: float
    service: tuple[float, float]
    switch: float


AGENTS = (
    Agent("coding agent", 2.0, (4.0, 12.0), 0.08),
    Agent("chat person", 30.0, (3.0, 10.0), 0.15),
    Agent("tool agent", 5.0, (1.0, 4.0), 0.10),
    Agent("writer", 20.0, (5.0, 15.0), 0.12),
    Agent("batch agent", 1.0, (2.0, 6.0), 0.05),
    Agent("second person", 45.0, (3.0, 8.0), 0.20),
)


class Turn(NamedTuple):
    """One request of an agent: its model, how long it runs, and the think time after its reply."""

    model: str
    service: float
    think: float


def workload(seed: int, agents: int, requests: int) -> list[list[Turn]]:
    """Each agent's requests, drawn once from ``seed``: the same script for every placement."""
    rng = random.Random(seed)
    names = list(POPULARITY)
    weights = list(POPULARITY.values())
    scripts: list[list[Turn]] = []
    for agent in AGENTS[:agents]:
        model = rng.choices(names, weights)[0]
        turns: list[Turn] = []
        for _ in range(requests):
            service = round(rng.uniform(*agent.service), 1)
            think = round(rng.expovariate(1.0 / agent.think), 1)
            turns.append(Turn(model, service, think))
            if rng.random() < agent.switch:
                others = [n for n in names if n != model]
                model = rng.choices(others, [POPULARITY[n] for n in others])[0]
        scripts.append(turns)
    return scripts


def devices(cards: Sequence[float]) -> list[DeviceSpec]:
    return [DeviceSpec(gpu, int(gib * GIB)) for gpu, gib in enumerate(cards)]


def anywhere(cards: Sequence[float], models: Mapping[str, float] = MODELS) -> Settings:
    """Every model placed by the scheduler, on any single card it fits."""
    specs = [
        ModelSpec.anywhere(
            name, [Placement((g,), {g: int(gib * GIB)}) for g, size in enumerate(cards) if gib <= size]
        )
        for name, gib in models.items()
    ]
    return Settings(models=specs, devices=devices(cards), policy=Policy())


def fixed(
    cards: Sequence[float], assignment: Sequence[int], models: Mapping[str, float] = MODELS
) -> Settings:
    """Each model bound to its card: ``assignment[i]`` is the card of the i-th model."""
    specs = [
        ModelSpec(name, gpus=(g,), need={g: int(gib * GIB)})
        for (name, gib), g in zip(models.items(), assignment, strict=True)
    ]
    return Settings(models=specs, devices=devices(cards), policy=Policy())


def partitions(items: int, blocks: int) -> Iterator[tuple[int, ...]]:
    """Set partitions of ``items`` into at most ``blocks`` groups, as restricted growth strings: item i's
    group is at most one more than the highest group before it, so each partition comes once."""

    def grow(prefix: tuple[int, ...], top: int) -> Iterator[tuple[int, ...]]:
        if len(prefix) == items:
            yield prefix
            return
        for group in range(min(top + 2, blocks)):
            yield from grow((*prefix, group), max(top, group))

    yield from grow((), -1)


def assignments(
    cards: Sequence[float], models: Mapping[str, float] = MODELS
) -> list[tuple[tuple[int, ...], int]]:
    """The fixed assignments to run, each with the count of raw assignments it stands for: on identical cards
    one per set partition (weighing ``n!/(n-k)!`` for ``k`` groups on ``n`` cards), else every raw one that
    fits."""
    n, sizes = len(cards), list(models.values())
    if len(set(cards)) == 1:
        if max(sizes) > cards[0]:
            return []
        out = []
        for groups in partitions(len(sizes), n):
            k = max(groups) + 1
            out.append((groups, len(list(itertools.permutations(range(n), k)))))
        return out
    return [
        (a, 1)
        for a in itertools.product(range(n), repeat=len(sizes))
        if all(gib <= cards[g] for gib, g in zip(sizes, a, strict=True))
    ]


class _Scripts(ClosedLoop):
    """Each agent plays its script: a request for the turn's model, then the turn's think time."""

    def __init__(self, settings: Settings, load: float, scripts: list[list[Turn]]) -> None:
        super().__init__(settings, load)
        self.scripts = scripts
        self.done = [0] * len(scripts)

    def turn(self, agent: int) -> Turn:
        return self.scripts[agent][self.done[agent]]

    def send(self, agent: int) -> None:
        self.arrive(agent, self.turn(agent).model)

    def service(self, rid: int) -> float:
        return self.turn(self.owner[rid]).service

    def finished(self, agent: int) -> None:
        think = self.turn(agent).think
        self.done[agent] += 1
        if self.done[agent] < len(self.scripts[agent]):
            self.later(self.now + think, ("send", agent))


def simulate(
    settings: Settings, scripts: list[list[Turn]], load: float, give_up: int | None = None
) -> dict[str, Any]:
    """Play the agents' scripts on the scheduler: loads, swaps, waits, total time and where models loaded.

    ``give_up``: stop as soon as the swaps exceed it (``stopped`` is then true and the figures are partial):
    enough to know that a fixed assignment swaps more than ``any``."""
    loop = _Scripts(settings, load, scripts)
    for agent in range(len(scripts)):
        loop.later(0.0, ("send", agent))
    loop.run(lambda: give_up is not None and loop.swaps > give_up)
    answered, swaps, waits = sum(loop.done), loop.swaps, loop.waits
    return {
        "requests": sum(len(s) for s in scripts),
        "answered": answered,
        "stopped": bool(loop.pending),
        "loads": len(loop.spawns),
        "swaps": swaps,
        "swaps_per_100": round(100 * swaps / answered, 1),
        "p50_wait_s": round(percentile(waits, 50) or 0.0, 1),
        "p95_wait_s": round(percentile(waits, 95) or 0.0, 1),
        "max_wait_s": round(max(waits), 1),
        "total_s": round(loop.total, 1),
        "cards_used": sorted({g for spawn in loop.spawns for g in spawn.gpus}),
        "first_placement": {model: gpus[0] for model, gpus in sorted(loop.first.items())},
    }


def layout(assignment: Sequence[int]) -> str:
    """An assignment in words: each card's models, e.g. ``0:ab 1:c 2:de 3:f``."""
    cards: dict[int, str] = {}
    for name, g in zip(MODELS, assignment, strict=True):
        cards[g] = cards.get(g, "") + name
    return " ".join(f"{g}:{cards[g]}" for g in sorted(cards))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run in the middle of ``runs`` (sorted by swaps) counted over the raw assignments they stand for."""
    middle = (sum(r["stands_for"] for r in runs) - 1) // 2
    for run in runs:
        middle -= run["stands_for"]
        if middle < 0:
            break
    return run


def compare(
    cards: Sequence[float],
    seed: int,
    agents: int,
    requests: int,
    load: float,
    models: Mapping[str, float] = MODELS,
) -> dict[str, Any]:
    """The whole benchmark on one workload: ``any`` and every fixed assignment."""
    scripts = workload(seed, agents, requests)
    chosen = simulate(anywhere(cards, models), scripts, load)
    runs = [
        {"assignment": layout(a), "stands_for": weight, **simulate(fixed(cards, a, models), scripts, load)}
        for a, weight in assignments(cards, models)
    ]
    runs.sort(key=lambda r: (r["swaps"], r["total_s"], r["assignment"]))
    no_better = [r for r in runs if r["swaps"] <= chosen["swaps"]]
    brief = ("assignment", "stands_for", "answered", "loads", "swaps", "p95_wait_s", "total_s")
    return {
        "any": chosen,
        "fixed": {
            "distinct": len(runs),
            "raw": sum(r["stands_for"] for r in runs),
            "best": runs[0] if runs else None,
            "median": median_run(runs) if runs else None,
            "worst": runs[-1] if runs else None,
            "at_most_any": len(no_better),
            "at_most_any_raw": sum(r["stands_for"] for r in no_better),
            "every_answered": all(r["answered"] == r["requests"] for r in runs),
            "runs": [{k: r[k] for k in brief} for r in runs],
        },
    }


def numbers(value: str) -> list[float]:
    try:
        out = [float(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {value!r}") from None
    if min(out) <= 0:
        raise argparse.ArgumentTypeError(f"give positive numbers: {value!r}")
    return out


def seeds(value: str) -> list[int]:
    """``3`` , ``1,2,5`` or ``1-8``."""
    try:
        if "-" in value:
            low, high = (int(v) for v in value.split("-"))
            return list(range(low, high + 1))
        return [int(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"give seeds as 3, 1,2,5 or 1-8: {value!r}") from None


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", "-n", type=int, default=100, help="requests each agent sends")
    parser.add_argument("--agents", type=int, default=4, choices=range(1, len(AGENTS) + 1))
    parser.add_argument("--seed", type=seeds, default=[1], help="workload seed(s): 1, or 1,2,5, or 1-8")
    parser.add_argument("--load", type=float, default=10.0, help="seconds a load takes")
    parser.add_argument("--cards", type=numbers, default=[12.0] * 4, help="card sizes in GiB, e.g. 24,12,8,8")
    parser.add_argument(
        "--sizes",
        type=numbers,
        default=list(MODELS.values()),
        help="the six models' sizes in GiB (default 7,7.5,8,8,8.5,9)",
    )
    return parser


def report(seed: int, result: dict[str, Any]) -> None:
    keys = ("loads", "swaps", "swaps_per_100", "p50_wait_s", "p95_wait_s", "max_wait_s", "total_s")
    head = ["placement", "stands for", "answered", "loads", "swaps", "per 100", "p50 wait", "p95 wait"]
    head += ["max wait", "total s"]
    chosen, fixed = result["any"], result["fixed"]
    rows: list[list[Any]] = [["any", "-", f"{chosen['answered']}/{chosen['requests']}"]]
    rows[0] += [chosen[k] for k in keys]
    for label in ("best", "median", "worst"):
        run = fixed[label]
        if run is not None:
            name = f"fixed {label} ({run['assignment']})"
            rows.append([name, run["stands_for"], f"{run['answered']}/{run['requests']}"])
            rows[-1] += [run[k] for k in keys]
    print_table(f"Seed {seed}: swaps and waits (waits in s)", head, rows)
    placed = " ".join(f"{m}→{g}" for m, g in chosen["first_placement"].items())
    print(f"any: cards used {chosen['cards_used']}; first load of each model on card: {placed}")
    print(
        f"fixed: {fixed['distinct']} distinct assignments run, standing for {fixed['raw']} raw ones; "
        f"with no more swaps than any: {fixed['at_most_any']} distinct, {fixed['at_most_any_raw']} raw "
        "(goal 0)\n"
    )


def summarize(results: dict[int, dict[str, Any]]) -> None:
    """One row per seed: does ``any`` swap less than every fixed assignment?"""
    rows = []
    for seed, result in results.items():
        chosen, fixed = result["any"], result["fixed"]
        best, median = fixed["best"], fixed["median"]
        row = [str(seed), chosen["swaps"], f"{best['swaps']} ({best['assignment']})", median["swaps"]]
        row += [fixed["worst"]["swaps"], f"{fixed['at_most_any']}/{fixed['at_most_any_raw']}"]
        rows.append([*row, fixed["at_most_any"] == 0])
    head = ["seed", "any swaps", "fixed best", "median", "worst", "fixed ≤ any (distinct/raw)", "goal met"]
    print_table("Every seed", head, rows)


def main() -> None:
    args = make_parser().parse_args()
    if len(args.sizes) != len(MODELS):
        raise SystemExit(f"--sizes: give {len(MODELS)} sizes")
    models = dict(zip(MODELS, args.sizes, strict=True))
    print(
        f"cards {','.join(f'{c:g}' for c in args.cards)} GiB, models "
        f"{', '.join(f'{m} {g:g}' for m, g in models.items())} GiB, {args.agents} agents × "
        f"{args.requests} requests, load {args.load:g} s\n"
    )
    results = {}
    for seed in args.seed:
        results[seed] = compare(args.cards, seed, args.agents, args.requests, args.load, models)
        report(seed, results[seed])
    if len(results) > 1:
        summarize(results)
    document = {"benchmark": "placement", "settings": vars(args), "models_gib": models, "results": results}
    print(f"wrote {write_result('placement', document)}")


if __name__ == "__main__":
    main()
