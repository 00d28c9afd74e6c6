"""How long one ``step()`` takes with 10, 1,000 and 10,000 waiting requests and 64 busy replicas.

The cluster: 8 GPUs, 16 models (two per GPU, max_models_per_gpu = 2), 4 replicas of 4 slots each, so 64
replicas and 256 slots, all ready and all busy, plus two pools over the models. Behind them wait Q requests
(for models and pools). The measured mix repeats: a request finishes (its slot goes to the next waiting
request), a new request arrives (and waits), the clock ticks; the queue stays near Q (the table shows its
mean). With ``--keys K`` the arrivals come from K keys (weights 1–3) in the three priority classes, so each
target's queue holds up to 3·K lanes. Prints a table and writes outputs/benchmark-step.json.

    python benchmarks/bench_step.py [--events N] [--queues 10,1000,10000] [--keys 0,100]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from statemachine import (  # noqa: E402
    DeviceSpec,
    Event,
    ModelSpec,
    Policy,
    PoolSpec,
    ReplicaReady,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    Startup,
    State,
    Tick,
    check,
    initial_state,
    step,
)
from statemachine.state import INFLIGHT  # noqa: E402

GPUS = 8
MODELS = 16
REPLICAS = 4
SLOTS = 4


def cluster(keys: int = 0) -> Settings:
    models = [
        ModelSpec(
            name=f"m{i:02d}",
            gpus=(i % GPUS,),
            replicas=REPLICAS,
            slots=SLOTS,
            ctx_per_slot=8192,
            need={i % GPUS: 10_000},
            load_on_startup=True,
        )
        for i in range(MODELS)
    ]
    pools = [
        PoolSpec("fast", ("m00", "m01", "m02"), fallback=True),
        PoolSpec("big", ("m08", "m09")),
    ]
    devices = [DeviceSpec(g, 100_000) for g in range(GPUS)]
    policy = Policy(max_models_per_gpu=2, queue_limit=1_000_000, routing_queue_limit=1_000_000)
    weights = {f"k{i}": 1 + i % 3 for i in range(keys)}
    return Settings(models=models, pools=pools, devices=devices, policy=policy, weights=weights)


class Driver:
    """Feeds events and keeps the environment's side: which requests are in flight."""

    def __init__(self, rng: random.Random, keys: int = 0) -> None:
        self.rng = rng
        self.keys = keys
        self.settings = cluster(keys)
        self.state: State = initial_state(self.settings)
        self.targets = [*sorted(self.settings.models), "fast", "big"]
        self.next_rid = 1
        self.now = 0.0
        self.inflight: list[int] = []

    def feed(self, event: Event) -> None:
        self.state, commands = step(self.state, event)
        for command in commands:
            rid = getattr(command, "rid", None)
            if type(command).__name__ == "Dispatch" and rid is not None:
                self.inflight.append(rid)

    def arrival(self) -> Event:
        target, tokens = self.rng.choice(self.targets), self.rng.randint(100, 4000)
        if self.keys:
            key, klass = f"k{self.rng.randrange(self.keys)}", self.rng.choice(list(RequestClass))
            event = RequestArrived(self.next_rid, target, tokens, key=key, klass=klass)
        else:
            event = RequestArrived(self.next_rid, target, tokens)
        self.next_rid += 1
        return event

    def finish(self) -> Event:
        index = self.rng.randrange(len(self.inflight))
        self.inflight[index], self.inflight[-1] = self.inflight[-1], self.inflight[index]
        return RequestFinished(self.inflight.pop())

    def warm_up(self, queued: int) -> None:
        """Load everything, fill every slot with a request for its model, then queue ``queued`` more."""
        self.feed(Startup())
        for replica in sorted(r.id for r in self.state.replicas):
            self.feed(ReplicaReady(replica))
        for model in sorted(self.settings.models):
            for _ in range(REPLICAS * SLOTS):
                self.feed(RequestArrived(self.next_rid, model, 1000))
                self.next_rid += 1
        while self.state.waiting < queued:
            self.feed(self.arrival())
        check(self.state)
        assert len(self.state.replicas) == MODELS * REPLICAS
        busy = sum(1 for r in self.state.requests.values() if r.phase == INFLIGHT)
        assert busy == MODELS * REPLICAS * SLOTS, busy


def measure(queued: int, events: int, keys: int = 0, seed: int = 7) -> dict[str, object]:
    driver = Driver(random.Random(seed), keys)
    driver.warm_up(queued)
    timings: dict[str, list[float]] = {"RequestFinished": [], "RequestArrived": [], "Tick": []}
    lengths: list[int] = []
    clock = time.perf_counter_ns
    for i in range(events):
        kind = i % 3
        if kind == 0:
            event = driver.finish()
        elif kind == 1:
            event = driver.arrival()
        else:
            driver.now += 0.01
            event = Tick(driver.now)
        start = clock()
        driver.feed(event)
        timings[type(event).__name__].append((clock() - start) / 1000.0)
        lengths.append(driver.state.waiting)
    check(driver.state)
    every = [t for ts in timings.values() for t in ts]
    return {
        "queued": queued,
        "keys": keys,
        "replicas": len(driver.state.replicas),
        "queued_mean": round(statistics.fmean(lengths)),
        "events": len(every),
        "median_us": round(statistics.median(every), 1),
        "p90_us": round(statistics.quantiles(every, n=10)[-1], 1),
        "events_per_s": round(len(every) / (sum(every) / 1e6)),
        "median_us_by_event": {k: round(statistics.median(v), 1) for k, v in timings.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000, help="measured events per queue size")
    parser.add_argument("--queues", default="10,1000,10000", help="comma-separated queue sizes")
    parser.add_argument("--keys", default="0", help="comma-separated key counts (0: anonymous, one class)")
    parser.add_argument("--out", default=str(ROOT / "outputs" / "benchmark-step.json"))
    args = parser.parse_args()
    rows = [
        measure(int(q), args.events, int(k)) for k in args.keys.split(",") for q in args.queues.split(",")
    ]
    header = (
        f"{'keys':>5} {'queued':>8} {'mean':>6} {'replicas':>8} {'median µs':>10} {'p90 µs':>8} "
        f"{'events/s':>9}  by event (median µs)"
    )
    print(header)
    for row in rows:
        by = ", ".join(f"{k} {v}" for k, v in row["median_us_by_event"].items())  # type: ignore[union-attr]
        print(
            f"{row['keys']:>5} {row['queued']:>8} {row['queued_mean']:>6} {row['replicas']:>8} "
            f"{row['median_us']:>10} {row['p90_us']:>8} "
            f"{row['events_per_s']:>9}  {by}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "statemachine.step",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cluster": {"gpus": GPUS, "models": MODELS, "replicas_per_model": REPLICAS, "slots": SLOTS},
        "mix": "finish, arrival, tick (repeating); queue length held at Q",
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
