"""Swaps on one GPU, measured on the scheduler itself with a simulated clock (no I/O, exact figures).

Closed-loop agents — each sends its next request ``think`` seconds after its reply — share one GPU that
holds one model at a time: one agent on model a and one on model b ("2 agents"), or two on each ("4
agents"). A load takes ``load`` seconds, a stop half a second, a request ``service`` seconds. Over
``horizon`` simulated seconds the benchmark counts loads (swaps), requests answered, and the p50/p95 time
from a request's arrival to its answer, under three orders:

- ``strict``: ``queue_head_grace = 0`` (arrival order across a swap);
- ``timed``: ``queue_head_grace = 30`` (later requests for the loaded model pass for 30 s, unbounded);
- ``batching``: the default (``swap_batch_max = 4``, ``swap_batch_window = 30``, hold a tenth of the loads).

Prints a table and writes outputs/benchmark-swaps.json.

    python benchmarks/bench_swaps.py [--load 10] [--service 2] [--horizon 1200]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from statemachine import (  # noqa: E402
    Dispatch,
    Event,
    Kill,
    ModelSpec,
    Policy,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    Tick,
    WakeAt,
    initial_state,
    step,
)

POLICIES = {
    "strict": Policy(queue_head_grace=0.0),
    "timed": Policy(queue_head_grace=30.0),
    "batching": Policy(queue_head_grace=30.0, swap_batch_max=4, swap_hold=None),
}


def simulate(
    policy: Policy, agents: list[str], load: float, service: float, think: float, horizon: float
) -> dict:
    state = initial_state(Settings(models=[ModelSpec("a"), ModelSpec("b")], policy=policy))
    pending: list[tuple[float, int, object]] = []
    order = itertools.count()
    now = 0.0
    rids = itertools.count(1)
    owner: dict[int, int] = {}
    sent: dict[int, float] = {}
    waits: list[float] = []
    loads = 0
    killed: set[int] = set()

    def later(at: float, what: object) -> None:
        heapq.heappush(pending, (at, next(order), what))

    def feed(event: Event) -> None:
        nonlocal state, loads
        state, commands = step(state, event)
        for command in commands:
            match command:
                case Spawn(replica=replica):
                    loads += 1
                    later(now + load, ReplicaReady(replica))
                case Kill(replica=replica):
                    killed.add(replica)
                    later(now + 0.5, ReplicaExited(replica, "stopped"))
                case Dispatch(rid=rid):
                    later(now + service, RequestFinished(rid))
                case WakeAt(at=at):
                    later(at, Tick(at))

    def send(agent: int) -> None:
        rid = next(rids)
        owner[rid], sent[rid] = agent, now
        feed(RequestArrived(rid, agents[agent]))

    for agent in range(len(agents)):
        later(agent * think, ("send", agent))
    while pending:
        at, _, what = heapq.heappop(pending)
        if at > horizon:
            break
        if at > now:
            now = at
            feed(Tick(now))
        if isinstance(what, tuple):
            send(what[1])
        elif isinstance(what, Tick) or (isinstance(what, ReplicaReady) and what.replica in killed):
            continue  # a stopped replica reports no readiness
        else:
            feed(what)  # type: ignore[arg-type]
            if isinstance(what, RequestFinished):
                waits.append(now - sent[what.rid])
                later(now + think, ("send", owner[what.rid]))
    waits.sort()
    return {
        "loads": loads,
        "answered": len(waits),
        "p50_s": round(statistics.median(waits), 2) if waits else None,
        "p95_s": round(waits[int(0.95 * (len(waits) - 1))], 2) if waits else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--load", type=float, default=10.0)
    parser.add_argument("--service", type=float, default=2.0)
    parser.add_argument("--think", type=float, default=0.05)
    parser.add_argument("--horizon", type=float, default=1200.0)
    args = parser.parse_args()
    results: dict[str, dict[str, dict]] = {}
    for label, agents in (("2 agents", ["a", "b"]), ("4 agents", ["a", "a", "b", "b"])):
        results[label] = {
            name: simulate(policy, agents, args.load, args.service, args.think, args.horizon)
            for name, policy in POLICIES.items()
        }
    print(f"load {args.load:g} s, request {args.service:g} s, {args.horizon:g} s simulated")
    print(f"{'':10} {'order':9} {'loads':>6} {'answered':>9} {'p50 s':>7} {'p95 s':>7}")
    for label, rows in results.items():
        for name, row in rows.items():
            print(
                f"{label:10} {name:9} {row['loads']:6} {row['answered']:9} {row['p50_s']:7} {row['p95_s']:7}"
            )
    out = ROOT / "outputs" / "benchmark-swaps.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
