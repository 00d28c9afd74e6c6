"""Prompt and generation throughput per model through the router, at concurrency 1 and at its slot count.

For each model and each concurrency level C (1, then the model's ``parallel`` slots), C workers send chat
requests back to back for ``--seconds``; every request has its own prompt and ``cache_prompt: false``, so
the whole prompt is evaluated each time, and generates exactly ``--tokens`` tokens. From llama-server's
``timings`` the script reports the per-request rates (``prompt_per_second``, ``predicted_per_second``,
medians) and, from the wall clock, the aggregate tokens per second of the whole level.

Without ``--url`` the router is started on two tiny generated models on two declared GPUs (both resident):
``small`` (2 slots) and ``wide`` (a larger tiny model, 4 slots). Writes outputs/benchmark-throughput.json.

    python benchmarks/bench_throughput.py [--url URL | --host HOST:PORT] [--seconds 6] [--tokens 128]
        [--prompt-words 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import LocalRouter, base_parser, print_table, run_benchmark
from benchmarks.services import DEVICE_MIB, make_models, shape_facts
from benchmarks.workload import async_client, chat_body, prompt_text, router_models
from router.cli.tinymodel import TinyShape

CHAT_PATH = "/v1/chat/completions"
SHAPES = {
    "small": TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, seed=1),
    "wide": TinyShape(n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=512, seed=2),
}
SLOTS = {"small": 2, "wide": 4}


@attrs.frozen
class Sample:
    """The timings of one successful request, and its wall-clock latency."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    latency: float

    @property
    def prompt_per_second(self) -> float | None:
        return 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else None

    @property
    def predicted_per_second(self) -> float | None:
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


async def measure_level(
    client: httpx.AsyncClient, model: str, concurrency: int, args: argparse.Namespace, seed_base: int
) -> dict[str, Any]:
    samples: list[Sample] = []
    failures: list[str] = []
    counter = iter(range(10**9))
    started = time.perf_counter()
    deadline = started + args.seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            index = next(counter)
            text = prompt_text(args.prompt_words, seed=seed_base + index)
            body = chat_body(model, args.tokens, f"{index}: {text}", cache_prompt=False)
            sent = time.perf_counter()
            try:
                response = await client.post(CHAT_PATH, json=body)
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            latency = time.perf_counter() - sent
            if response.status_code != 200:
                failures.append(f"{response.status_code}: {response.text[:200]}")
                continue
            timings = response.json().get("timings") or {}
            try:
                samples.append(
                    Sample(
                        int(timings["prompt_n"]),
                        float(timings["prompt_ms"]),
                        int(timings["predicted_n"]),
                        float(timings["predicted_ms"]),
                        latency,
                    )
                )
            except (KeyError, TypeError, ValueError):
                failures.append(f"no timings in the reply: {response.text[:200]}")

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    wall = time.perf_counter() - started
    prompt_tokens = sum(s.prompt_n for s in samples)
    predicted_tokens = sum(s.predicted_n for s in samples)
    return {
        "model": model,
        "concurrency": concurrency,
        "requests": len(samples),
        "failures": len(failures),
        "failure_examples": failures[:5],
        "wall_s": wall,
        "prompt_tokens": prompt_tokens,
        "predicted_tokens": predicted_tokens,
        "median_prompt_n": _median([float(s.prompt_n) for s in samples]),
        "median_prompt_per_second": _median([s.prompt_per_second for s in samples]),
        "median_predicted_per_second": _median([s.predicted_per_second for s in samples]),
        "median_latency_s": _median([s.latency for s in samples]),
        "aggregate_prompt_per_second": prompt_tokens / wall if wall > 0 else None,
        "aggregate_predicted_per_second": predicted_tokens / wall if wall > 0 else None,
        "aggregate_tokens_per_second": (prompt_tokens + predicted_tokens) / wall if wall > 0 else None,
    }


async def benchmark(url: str, args: argparse.Namespace) -> dict[str, Any]:
    async with async_client(url) as client:
        listed = {entry["id"]: entry for entry in await router_models(client)}
        models = args.models.split(",") if args.models else list(listed)
        missing = [m for m in models if m not in listed]
        if missing:
            raise SystemExit(f"models not served by {url}: {missing} (it serves {sorted(listed)})")
        rows: list[dict[str, Any]] = []
        for number, model in enumerate(models):
            slots = int(listed[model].get("parallel") or 1)
            warm = await client.post(CHAT_PATH, json=chat_body(model, 4, "warm up"))
            warm.raise_for_status()
            for concurrency in sorted({1, slots}):
                seed_base = 1_000_000 * (number + 1) + 10_000 * concurrency
                rows.append(await measure_level(client, model, concurrency, args, seed_base))
        return {
            "models": {
                m: {"parallel": listed[m].get("parallel"), "ctx": listed[m].get("ctx")} for m in models
            },
            "rows": rows,
        }


def report(result: dict[str, Any]) -> None:
    table = []
    for row in result["rows"]:
        table.append(
            [
                row["model"],
                row["concurrency"],
                row["requests"],
                row["failures"],
                row["median_prompt_n"],
                row["median_prompt_per_second"],
                row["median_predicted_per_second"],
                row["aggregate_prompt_per_second"],
                row["aggregate_predicted_per_second"],
                None if row["median_latency_s"] is None else 1000.0 * row["median_latency_s"],
            ]
        )
    print_table(
        "Throughput (tokens/s; per-request medians from llama-server timings, aggregate from the wall clock)",
        [
            "model",
            "conc",
            "requests",
            "failed",
            "prompt_n",
            "prompt tok/s",
            "gen tok/s",
            "aggr prompt tok/s",
            "aggr gen tok/s",
            "p50 latency ms",
        ],
        table,
    )


def make_parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="duration of each concurrency level")
    parser.add_argument("--tokens", type=int, default=128, help="tokens each request generates")
    parser.add_argument("--prompt-words", type=int, default=100, help="words in each prompt")
    parser.add_argument("--models", help="comma-separated models (default: all listed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)

    def setup(work: Path) -> LocalRouter:
        paths = make_models(work / "models", SHAPES)
        models = {
            name: {
                "model": str(paths[name]),
                "gpus": [gpu],
                "parallel": SLOTS[name],
                "ctx": 512 * SLOTS[name],
            }
            for gpu, name in enumerate(SHAPES)
        }
        target = {
            "devices": {"0": DEVICE_MIB, "1": DEVICE_MIB},
            "models": {
                name: {**{k: v for k, v in table.items() if k != "model"}, "shape": shape_facts(SHAPES[name])}
                for name, table in models.items()
            },
            "threads": 1,
        }
        return LocalRouter(models, target, {0: DEVICE_MIB, 1: DEVICE_MIB})

    return run_benchmark("throughput", args, benchmark, setup, report)


if __name__ == "__main__":
    sys.exit(main())
