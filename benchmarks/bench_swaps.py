"""Swaps on one GPU, measured on the scheduler itself with a simulated clock (no I/O, exact figures).

Closed-loop agents — each sends its next request ``think`` seconds after its reply, ``requests`` requests in
all — share one GPU that holds one model at a time: one agent on model a and one on model b ("2 agents"),
or two on each ("4 agents"). A load takes ``load`` seconds, a stop half a second, a request ``service``
seconds. The benchmark counts loads (swaps) per 100 requests, the p50/p95/max wait of a request (from its
arrival to its dispatch) and the total time until the last answer, under three orders:

- ``strict``: ``queue_head_grace = 0`` (arrival order across a swap);
- ``timed``: ``queue_head_grace = 30`` (later requests for the loaded model pass for 30 s, unbounded);
- ``batching``: the default (``swap_batch_max = 4``, ``swap_batch_window = 30``, hold a tenth of the loads).

Batching's bound: no request waits longer than the window, then the drain of the request in flight, the
stop and the load (``bound_s``); ``within_bound`` says whether every wait kept it.

Prints a table and writes outputs/benchmark-swaps.json.

    python benchmarks/bench_swaps.py [--load 10] [--service 2] [--requests 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.closed_loop import STOP, ClosedLoop  # noqa: E402
from statemachine import ModelSpec, Policy, Settings  # noqa: E402

POLICIES = {
    "strict": Policy(queue_head_grace=0.0),
    "timed": Policy(queue_head_grace=30.0),
    "batching": Policy(queue_head_grace=30.0, swap_batch_max=4, swap_hold=None),
}


WINDOW = 30.0


class _Agents(ClosedLoop):
    """Agents that each send ``requests`` requests for their model, ``think`` seconds after each reply."""

    def __init__(
        self, settings: Settings, load: float, agents: list[str], service: float, think: float, requests: int
    ) -> None:
        super().__init__(settings, load)
        self.agents, self.seconds, self.think, self.requests = agents, service, think, requests
        self.count = [0] * len(agents)
        self.answered = 0

    def send(self, agent: int) -> None:
        if self.count[agent] == self.requests:
            return
        self.count[agent] += 1
        self.arrive(agent, self.agents[agent])

    def service(self, rid: int) -> float:
        return self.seconds

    def finished(self, agent: int) -> None:
        self.answered += 1
        self.later(self.now + self.think, ("send", agent))


def simulate(
    policy: Policy, agents: list[str], load: float, service: float, think: float, requests: int
) -> dict:
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b")], policy=policy)
    loop = _Agents(settings, load, agents, service, think, requests)
    for agent in range(len(agents)):
        loop.later(agent * think, ("send", agent))
    loop.run()
    waits, loads, answered, total = sorted(loop.waits), len(loop.spawns), loop.answered, loop.total
    bound = WINDOW + service + STOP + load
    return {
        "loads": loads,
        "answered": answered,
        "swaps_per_100": round(100 * loads / answered, 1),
        "p50_wait_s": round(statistics.median(waits), 2),
        "p95_wait_s": round(waits[int(0.95 * (len(waits) - 1))], 2),
        "max_wait_s": round(waits[-1], 2),
        "total_s": round(total, 1),
        "bound_s": bound,
        "within_bound": waits[-1] <= bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--load", type=float, default=10.0)
    parser.add_argument("--service", type=float, default=2.0)
    parser.add_argument("--think", type=float, default=0.05)
    parser.add_argument("--requests", type=int, default=100, help="requests each agent sends")
    args = parser.parse_args()
    results: dict[str, dict[str, dict]] = {}
    for label, agents in (("2 agents", ["a", "b"]), ("4 agents", ["a", "a", "b", "b"])):
        results[label] = {
            name: simulate(policy, agents, args.load, args.service, args.think, args.requests)
            for name, policy in POLICIES.items()
        }
    print(f"load {args.load:g} s, request {args.service:g} s, {args.requests} requests per agent")
    head = ("order", "loads", "per 100", "p50 wait", "p95 wait", "max wait", "total s", "bound kept")
    print(f"{'':10} {head[0]:9} " + " ".join(f"{h:>10}" for h in head[1:]))
    for label, rows in results.items():
        for name, row in rows.items():
            keys = ("loads", "swaps_per_100", "p50_wait_s", "p95_wait_s", "max_wait_s", "total_s")
            keys += ("within_bound",)
            print(f"{label:10} {name:9} " + " ".join(f"{row[k]!s:>10}" for k in keys))
        strict, batching = rows["strict"], rows["batching"]
        print(
            f"{label:10} batching against strict: {strict['swaps_per_100'] / batching['swaps_per_100']:.1f}x "
            f"fewer swaps per 100 requests, {batching['total_s'] / strict['total_s']:.2f}x the total time"
        )
    out = ROOT / "outputs" / "benchmark-swaps.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
