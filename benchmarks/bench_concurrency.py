"""Many concurrent requests over models that must swap on one GPU while another stays resident.

N chat requests (default 100) go through a pool of W workers (default 16) to the router, each naming a
model drawn at random (seeded). Without ``--url`` the script starts the router on tiny generated models:
``swap-a`` and ``swap-b`` (and ``swap-c`` with ``--swap-models 3``) share GPU 0, which holds one model at a
time, and ``steady`` lives alone on GPU 1; the GPUs are declared in the config, so no GPU is needed. Every
model is warmed up first; then the run is timed. While it runs, /status is polled for its recent events
(loads, evictions, failures) and its queue length.

Prints per-model success rate and latency percentiles and the swap count; writes
outputs/benchmark-concurrency.json.

    python benchmarks/bench_concurrency.py [--url URL | --host HOST:PORT] [--requests|-n 100]
        [--workers 16] [--tokens 16]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import LocalRouter, base_parser, ms, print_table, run_benchmark, summary
from benchmarks.services import DEVICE_MIB, make_models, shape_facts
from benchmarks.workload import async_client, chat_body, fetch_json, prompt_text, router_models
from router.cli.tinymodel import TinyShape

SHAPE = TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128)
CHAT_PATH = "/v1/chat/completions"


@attrs.frozen
class Outcome:
    """One request of the run: when it started (seconds after the run began), how it ended."""

    index: int
    model: str
    started: float
    latency: float
    status: int
    ok: bool
    served_by: str | None
    error: str | None


class StatusWatcher:
    """Polls /status, keeping every recent event it has seen (the router keeps only the last 200)."""

    def __init__(self, client: httpx.AsyncClient, interval: float) -> None:
        self.client = client
        self.interval = interval
        self.events: dict[tuple[float, str, int, str], dict[str, Any]] = {}
        self.max_queue = 0
        self.polls = 0
        self.errors = 0

    async def poll(self) -> None:
        try:
            document = await fetch_json(self.client, "/status")
        except (httpx.HTTPError, ValueError):
            self.errors += 1
            return
        self.polls += 1
        self.max_queue = max(self.max_queue, len(document.get("queue", [])))
        for event in document.get("recent", []):
            key = (float(event["at"]), str(event["kind"]), int(event["replica"]), str(event["model"]))
            self.events[key] = event

    async def run(self) -> None:
        while True:
            await self.poll()
            await trio.sleep(self.interval)

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        chosen = [e for key, e in self.events.items() if start <= key[0] <= end]
        return sorted(chosen, key=lambda e: float(e["at"]))


def count_events(events: list[dict[str, Any]]) -> dict[str, int]:
    evictions = [e for e in events if e["kind"] == "stop" and e.get("cause") == "evicted"]
    return {
        "loads": sum(1 for e in events if e["kind"] == "load"),
        "ready": sum(1 for e in events if e["kind"] == "ready"),
        "evictions": len(evictions),
        "load_failures": sum(1 for e in events if e["kind"] == "load_failed"),
        "unexpected_exits": sum(1 for e in events if e["kind"] == "exited" and e.get("asked") is False),
    }


async def one_request(
    client: httpx.AsyncClient, index: int, model: str, tokens: int, run_start: float
) -> Outcome:
    body = chat_body(model, tokens, prompt_text(12, seed=index))
    started = time.perf_counter()
    status = 0
    error: str | None = None
    served_by: str | None = None
    ok = False
    try:
        response = await client.post(CHAT_PATH, json=body)
        status = response.status_code
        served_by = response.headers.get("x-router-model")
        if status == 200:
            usage = response.json().get("usage") or {}
            ok = usage.get("completion_tokens") == tokens
            if not ok:
                error = f"completion_tokens {usage.get('completion_tokens')} != {tokens}"
        else:
            error = response.text[:200]
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    latency = time.perf_counter() - started
    return Outcome(index, model, started - run_start, latency, status, ok, served_by, error)


async def run_load(
    client: httpx.AsyncClient, plan: list[str], workers: int, tokens: int
) -> tuple[list[Outcome], float]:
    outcomes: list[Outcome] = []
    send, receive = trio.open_memory_channel[tuple[int, str]](len(plan))
    for job in enumerate(plan):
        send.send_nowait(job)
    send.close()
    run_start = time.perf_counter()

    async def worker() -> None:
        async for index, model in receive:
            outcomes.append(await one_request(client, index, model, tokens, run_start))

    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(worker)
    return sorted(outcomes, key=lambda o: o.index), time.perf_counter() - run_start


async def benchmark(url: str, args: argparse.Namespace) -> dict[str, Any]:
    async with async_client(url) as client:
        listed = await router_models(client)
        known = {entry["id"]: entry for entry in listed}
        models = args.models.split(",") if args.models else list(known)
        missing = [m for m in models if m not in known]
        if missing:
            raise SystemExit(f"models not served by {url}: {missing} (it serves {sorted(known)})")
        rng = random.Random(args.seed)
        plan = [rng.choice(models) for _ in range(args.requests)]

        warmup: dict[str, float] = {}
        if not args.no_warmup:
            for model in models:
                started = time.perf_counter()
                response = await client.post(CHAT_PATH, json=chat_body(model, 1))
                response.raise_for_status()
                warmup[model] = time.perf_counter() - started

        watcher = StatusWatcher(client, args.poll)
        await watcher.poll()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.run)
            wall_start = time.time()
            outcomes, wall = await run_load(client, plan, args.workers, args.tokens)
            wall_end = time.time()
            await watcher.poll()
            nursery.cancel_scope.cancel()

    events = watcher.between(wall_start, wall_end)
    per_model: dict[str, Any] = {}
    for model in [*models, "all"]:
        chosen = [o for o in outcomes if model in ("all", o.model)]
        ok = [o for o in chosen if o.ok]
        per_model[model] = {
            "gpus": known[model].get("gpus") if model in known else None,
            "requests": len(chosen),
            "ok": len(ok),
            "success_rate": len(ok) / len(chosen) if chosen else None,
            "latency_s": summary([o.latency for o in ok]),
            "statuses": dict(Counter(str(o.status) for o in chosen)),
        }
    errors = Counter(o.error for o in outcomes if o.error)
    return {
        "models": {m: {"gpus": known[m].get("gpus"), "parallel": known[m].get("parallel")} for m in models},
        "warmup_s": warmup,
        "wall_s": wall,
        "requests_per_s": len(outcomes) / wall if wall > 0 else None,
        "per_model": per_model,
        "events": count_events(events),
        "event_log": [{k: e[k] for k in ("at", "kind", "model", "replica", "reason")} for e in events],
        "max_queue_seen": watcher.max_queue,
        "status_polls": watcher.polls,
        "errors": [{"error": error, "count": count} for error, count in errors.most_common(10)],
        "outcomes": [attrs.asdict(o) for o in outcomes],
    }


def local_setup(work: Path, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Models and router settings of the self-started router."""
    swap_names = ["swap-a", "swap-b", "swap-c"][: args.swap_models]
    shapes = {name: attrs.evolve(SHAPE, seed=i + 1) for i, name in enumerate([*swap_names, "steady"])}
    paths = make_models(work / "models", shapes)
    models: dict[str, Any] = {
        name: {"model": str(paths[name]), "gpus": [0], "parallel": args.parallel, "ctx": 1024}
        for name in swap_names
    }
    models["steady"] = {"model": str(paths["steady"]), "gpus": [1], "parallel": args.parallel, "ctx": 1024}
    router = {"max_models_per_gpu": 1, "queue_head_grace": args.grace}
    setup = {
        "router": router,
        "devices": {"0": DEVICE_MIB, "1": DEVICE_MIB},
        "models": {name: {k: v for k, v in table.items() if k != "model"} for name, table in models.items()},
        "shape": shape_facts(SHAPE),
    }
    return models, {"router": router, "setup": setup}


def report(result: dict[str, Any]) -> None:
    rows = []
    for model, stats in result["per_model"].items():
        latency = stats["latency_s"]
        rows.append(
            [
                model,
                ",".join(str(g) for g in stats["gpus"]) if stats["gpus"] is not None else "",
                stats["requests"],
                stats["ok"],
                None if stats["success_rate"] is None else 100.0 * stats["success_rate"],
                ms(latency["p50"]),
                ms(latency["p90"]),
                ms(latency["p99"]),
                ms(latency["max"]),
            ]
        )
    print_table(
        "Concurrency: latency per model (ms)",
        ["model", "gpus", "requests", "ok", "success %", "p50", "p90", "p99", "max"],
        rows,
    )
    events = result["events"]
    print_table(
        "Concurrency: run",
        ["wall s", "req/s", "loads", "evictions (swaps)", "load failures", "max queue seen"],
        [
            [
                result["wall_s"],
                result["requests_per_s"],
                events["loads"],
                events["evictions"],
                events["load_failures"],
                result["max_queue_seen"],
            ]
        ],
    )
    for error in result["errors"]:
        print(f"error x{error['count']}: {error['error']}")


def make_parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--requests", "-n", type=int, default=100, help="requests in the run")
    parser.add_argument("--workers", type=int, default=16, help="concurrent workers")
    parser.add_argument("--tokens", type=int, default=16, help="tokens each request generates")
    parser.add_argument("--models", help="comma-separated models to spread over (default: all listed)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the model choice")
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between /status polls")
    parser.add_argument("--no-warmup", action="store_true", help="do not load every model before the run")
    parser.add_argument("--swap-models", type=int, choices=(2, 3), default=2, help="models sharing GPU 0")
    parser.add_argument("--parallel", type=int, default=2, help="slots per replica (self-started router)")
    parser.add_argument("--grace", type=float, default=0.0, help="queue_head_grace (self-started router)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)

    def setup(work: Path) -> LocalRouter:
        models, extra = local_setup(work, args)
        return LocalRouter(models, extra["setup"], {0: DEVICE_MIB, 1: DEVICE_MIB}, extra["router"])

    return run_benchmark("concurrency", args, benchmark, setup, report)


if __name__ == "__main__":
    sys.exit(main())
