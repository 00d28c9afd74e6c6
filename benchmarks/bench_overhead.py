"""What a router in front of llama-server costs: direct, through this router, through llama.cpp's router mode.

The same workload goes, in one run, to three targets serving the same tiny model file with the same flags
(context, slots, one thread):

    direct     one bare llama-server
    router     this router (``python -m router``), models A and B on one declared GPU, max_models_per_gpu 1
    llamacpp   llama.cpp's own router mode, ``llama-server --models-dir DIR --models-max 1`` (a request
               picks the model by the file name without ``.gguf``)

Requests are interleaved — each round sends one request to every target in a shuffled order — so the
targets share the machine's noise. Phases: small non-streaming requests (latency p50/p99, and what the
router adds over direct), streaming requests (time to first token, content chunks per second), and
A→B→A swap sequences for the two routers (wall time of the three requests; each swap stops one
llama-server and starts another). Ratios are target/direct; for swaps, llama.cpp router mode / this router.
If router mode does not start or does not answer, the reason is recorded and the other targets still run.

Without ``--url`` all three targets are started here. With ``--url`` (this router, serving ``--model`` and,
for swaps, ``--swap-model`` on the same GPU) the others are ``--direct-url`` and ``--llamacpp-url``; a target
whose address is not given is left out. Writes outputs/benchmark-overhead.json.

    python benchmarks/bench_overhead.py [--small|-n 200] [--streams 30] [--swaps 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead_goals import evaluate, goals_document
from benchmarks.overhead_load import concurrent_phase, crowd_phase, report_load
from benchmarks.results import (
    base_parser,
    machine_facts,
    ms,
    print_table,
    ratio,
    settings_of,
    summary,
    write_result,
)
from benchmarks.services import (
    DEVICE_MIB,
    BenchmarkError,
    llama_server_binary,
    llama_server_process,
    llamacpp_router_process,
    make_models,
    router_process,
    shape_facts,
    work_directory,
)
from benchmarks.workload import StreamResult, async_client, chat_body, stream_chat
from router.cli.tinymodel import TinyShape

CHAT_PATH = "/v1/chat/completions"
SHAPES = {
    "alpha": TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, seed=1),
    "beta": TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, seed=2),
    "gamma": TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, seed=3),
}
TARGETS = ("direct", "router", "llamacpp")
LABELS = {
    "direct": "llama-server (direct)",
    "router": "llama-router",
    "llamacpp": "llama.cpp router mode",
}


async def timed_post(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, int, str]:
    started = time.perf_counter()
    response = await client.post(CHAT_PATH, json=body)
    return time.perf_counter() - started, response.status_code, response.text[:300]


async def warm_up(
    clients: dict[str, httpx.AsyncClient], model: str, skipped: dict[str, str]
) -> dict[str, float]:
    """One request per target (it loads the model in the routers); a target that fails it is dropped."""
    seconds: dict[str, float] = {}
    for key in list(clients):
        try:
            elapsed, status, text = await timed_post(clients[key], chat_body(model, 2))
        except httpx.HTTPError as exc:
            skipped[key] = f"warm-up request failed: {type(exc).__name__}: {exc}"
            del clients[key]
            continue
        if status != 200:
            skipped[key] = f"warm-up request answered {status}: {text}"
            del clients[key]
            continue
        seconds[key] = elapsed
    return seconds


async def small_phase(
    clients: dict[str, httpx.AsyncClient], model: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, dict[str, Any]]:
    latencies: dict[str, list[float]] = {key: [] for key in clients}
    failures: dict[str, list[str]] = {key: [] for key in clients}
    body = chat_body(model, args.small_tokens, "Hello")
    for _ in range(args.small):
        for key in rng.sample(list(clients), len(clients)):
            try:
                elapsed, status, text = await timed_post(clients[key], body)
            except httpx.HTTPError as exc:
                failures[key].append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            if status == 200:
                latencies[key].append(elapsed)
            else:
                failures[key].append(f"{status}: {text}")
    return {
        key: {
            "latency_s": summary(latencies[key]),
            "failures": len(failures[key]),
            "errors": failures[key][:5],
        }
        for key in clients
    }


async def stream_phase(
    clients: dict[str, httpx.AsyncClient], model: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, dict[str, Any]]:
    results: dict[str, list[StreamResult]] = {key: [] for key in clients}
    failures: dict[str, list[str]] = {key: [] for key in clients}
    body = chat_body(model, args.stream_tokens, "Tell me a story", stream=True)
    for _ in range(args.streams):
        for key in rng.sample(list(clients), len(clients)):
            try:
                result = await stream_chat(clients[key], body, CHAT_PATH)
            except httpx.HTTPError as exc:
                failures[key].append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            if result.status == 200 and result.ttft is not None:
                results[key].append(result)
            else:
                failures[key].append(f"status {result.status}, {result.chunks} content chunks")
    out: dict[str, dict[str, Any]] = {}
    for key, items in results.items():
        rates = [r.chunk_rate for r in items if r.chunk_rate is not None]
        out[key] = {
            "ttft_s": summary([r.ttft for r in items if r.ttft is not None]),
            "total_s": summary([r.total for r in items]),
            "chunk_rate_per_s": summary(rates),
            "median_chunks": statistics.median([r.chunks for r in items]) if items else None,
            "failures": len(failures[key]),
            "errors": failures[key][:5],
        }
    return out


async def swap_phase(
    clients: dict[str, httpx.AsyncClient], a: str, b: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, dict[str, Any]]:
    """Rounds of A (resident), B (swap in), A (swap back), timed as a whole and per leg."""
    legs: dict[str, list[list[float]]] = {key: [] for key in clients}
    failures: dict[str, list[str]] = {key: [] for key in clients}
    for _ in range(args.swaps):
        for key in rng.sample(list(clients), len(clients)):
            times: list[float] = []
            for model in (a, b, a):
                try:
                    elapsed, status, text = await timed_post(
                        clients[key], chat_body(model, args.small_tokens)
                    )
                except httpx.HTTPError as exc:
                    failures[key].append(f"{model}: {type(exc).__name__}: {exc}"[:300])
                    break
                if status != 200:
                    failures[key].append(f"{model}: {status}: {text}")
                    break
                times.append(elapsed)
            if len(times) == 3:
                legs[key].append(times)
    out: dict[str, dict[str, Any]] = {}
    for key in clients:
        rounds = legs[key]
        out[key] = {
            "total_s": summary([sum(r) for r in rounds]),
            "leg_a_s": summary([r[0] for r in rounds]),
            "leg_b_s": summary([r[1] for r in rounds]),
            "leg_back_s": summary([r[2] for r in rounds]),
            "failures": failures[key],
        }
    return out


async def benchmark(
    urls: dict[str, str], skipped: dict[str, str], args: argparse.Namespace, pids: dict[str, int]
) -> dict[str, Any]:
    rng = random.Random(args.seed)
    clients = {key: async_client(url, timeout=120.0) for key, url in urls.items()}
    try:
        active = dict(clients)
        warm = await warm_up(active, args.model, skipped)
        small = await small_phase(active, args.model, args, rng)
        streams = await stream_phase(active, args.model, args, rng)
        swap_clients = {k: c for k, c in active.items() if k != "direct"}
        swaps: dict[str, dict[str, Any]] = {}
        if args.swap_model and args.swaps > 0 and swap_clients:
            swaps = await swap_phase(swap_clients, args.model, args.swap_model, args, rng)
        levels = [int(v) for v in args.concurrent.split(",") if v.strip()]
        live = {key: urls[key] for key in active}
        concurrent = await concurrent_phase(
            live, pids, args.model, levels, args.concurrent_tokens, args.concurrent_rounds, rng
        )
        crowd = None
        crowd_models = [m for m in (args.model, args.swap_model, args.third_model) if m]
        if args.crowd > 0 and "router" in active:
            crowd = await crowd_phase(
                urls["router"], pids.get("router"), crowd_models, args.crowd, args.small_tokens, rng
            )
    finally:
        for client in clients.values():
            await client.aclose()
    return {
        "targets": {key: {"label": LABELS[key], "url": urls[key]} for key in urls},
        "skipped": skipped,
        "warmup_s": warm,
        "small": small,
        "streams": streams,
        "swaps": swaps,
        "concurrent": concurrent,
        "crowd": crowd,
        "ratios": ratios(small, streams, swaps),
    }


def _p(stats: dict[str, Any], key: str, q: str) -> float | None:
    return (stats.get(key) or {}).get(q)


def ratios(
    small: dict[str, dict[str, Any]], streams: dict[str, dict[str, Any]], swaps: dict[str, dict[str, Any]]
) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    base_small = small.get("direct", {})
    base_stream = streams.get("direct", {})
    for key in ("router", "llamacpp"):
        entry: dict[str, float | None] = {}
        if key in small and base_small:
            for q in ("p50", "p99"):
                mine, base = _p(small[key], "latency_s", q), _p(base_small, "latency_s", q)
                entry[f"small_{q}_ratio"] = ratio(mine, base)
                entry[f"small_added_{q}_ms"] = (
                    None if mine is None or base is None else 1000.0 * (mine - base)
                )
        if key in streams and base_stream:
            entry["ttft_p50_ratio"] = ratio(
                _p(streams[key], "ttft_s", "p50"), _p(base_stream, "ttft_s", "p50")
            )
            entry["ttft_p99_ratio"] = ratio(
                _p(streams[key], "ttft_s", "p99"), _p(base_stream, "ttft_s", "p99")
            )
            entry["chunk_rate_p50_ratio"] = ratio(
                _p(streams[key], "chunk_rate_per_s", "p50"), _p(base_stream, "chunk_rate_per_s", "p50")
            )
        if entry:
            out[f"{key}/direct"] = entry
    if "router" in swaps and "llamacpp" in swaps:
        out["llamacpp/router"] = {
            "swap_total_p50_ratio": ratio(
                _p(swaps["llamacpp"], "total_s", "p50"), _p(swaps["router"], "total_s", "p50")
            )
        }
    return out


def report(result: dict[str, Any], level: int) -> None:
    """Print the tables; ``level`` is the count of concurrent streams the aggregate goal is judged at."""
    small = result["small"]
    base = small.get("direct")
    rows = []
    for key, stats in small.items():
        latency = stats["latency_s"]
        added50 = added99 = r50 = r99 = None
        if base is not None and key != "direct":
            b50, b99 = base["latency_s"]["p50"], base["latency_s"]["p99"]
            added50 = None if latency["p50"] is None or b50 is None else latency["p50"] - b50
            added99 = None if latency["p99"] is None or b99 is None else latency["p99"] - b99
            r50, r99 = ratio(latency["p50"], b50), ratio(latency["p99"], b99)
        rows.append(
            [
                LABELS[key],
                latency["n"],
                stats["failures"],
                ms(latency["p50"]),
                ms(latency["p90"]),
                ms(latency["p99"]),
                ms(added50),
                ms(added99),
                None if r50 is None else f"{r50:.2f}",
                None if r99 is None else f"{r99:.2f}",
            ]
        )
    print_table(
        "Overhead: small non-streaming requests (ms)",
        ["target", "ok", "failed", "p50", "p90", "p99", "added p50", "added p99", "p50 ratio", "p99 ratio"],
        rows,
    )
    streams = result["streams"]
    sbase = streams.get("direct")
    rows = []
    for key, stats in streams.items():
        t50, t99 = _p(stats, "ttft_s", "p50"), _p(stats, "ttft_s", "p99")
        rate = _p(stats, "chunk_rate_per_s", "p50")
        tr = cr = None
        if sbase is not None and key != "direct":
            tr = ratio(t50, _p(sbase, "ttft_s", "p50"))
            cr = ratio(rate, _p(sbase, "chunk_rate_per_s", "p50"))
        rows.append(
            [
                LABELS[key],
                stats["ttft_s"]["n"],
                stats["failures"],
                ms(t50),
                ms(t99),
                rate,
                ms(_p(stats, "total_s", "p50")),
                None if tr is None else f"{tr:.2f}",
                None if cr is None else f"{cr:.2f}",
            ]
        )
    print_table(
        "Overhead: streaming requests",
        [
            "target",
            "ok",
            "failed",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "chunks/s p50",
            "total p50 ms",
            "TTFT ratio",
            "chunk rate ratio",
        ],
        rows,
    )
    swaps = result["swaps"]
    if swaps:
        rbase = swaps.get("router")
        rows = []
        for key, stats in swaps.items():
            total = stats["total_s"]
            rr = ratio(total["p50"], _p(rbase, "total_s", "p50")) if rbase is not None else None
            rows.append(
                [
                    LABELS[key],
                    total["n"],
                    len(stats["failures"]),
                    total["p50"],
                    total["min"],
                    total["max"],
                    _p(stats, "leg_a_s", "p50"),
                    _p(stats, "leg_b_s", "p50"),
                    _p(stats, "leg_back_s", "p50"),
                    None if rr is None else f"{rr:.2f}",
                ]
            )
        print_table(
            "Overhead: A→B→A swap sequence (seconds; one model per GPU / models-max 1)",
            [
                "target",
                "rounds",
                "failed",
                "total p50",
                "min",
                "max",
                "A p50",
                "B p50",
                "back to A p50",
                "vs llama-router",
            ],
            [
                [r[0], *r[1:3], *(f"{v:.3f}" if isinstance(v, float) else v for v in r[3:9]), r[9]]
                for r in rows
            ],
        )
        for key, stats in swaps.items():
            for failure in stats["failures"][:3]:
                print(f"{LABELS[key]} swap failure: {failure}")
    report_load(result, LABELS, level)
    for phase in ("small", "streams"):
        for key, stats in result[phase].items():
            for error in stats.get("errors", [])[:3]:
                print(f"{LABELS[key]} {phase} failure: {error}")
    for key, reason in result["skipped"].items():
        print(f"{LABELS[key]} left out: {reason}")


def link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def make_parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--small", "-n", type=int, default=200, help="rounds of small non-streaming requests")
    parser.add_argument("--small-tokens", type=int, default=4, help="tokens a small request generates")
    parser.add_argument("--streams", type=int, default=30, help="rounds of streaming requests")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens a stream generates")
    parser.add_argument("--swaps", type=int, default=3, help="A→B→A sequences per router")
    parser.add_argument("--parallel", type=int, default=2, help="slots of every llama-server")
    parser.add_argument("--ctx", type=int, default=2048, help="context of every llama-server")
    parser.add_argument("--seed", type=int, default=1, help="seed of the interleaving order")
    parser.add_argument("--model", default="alpha", help="model A (with --url: as this router names it)")
    parser.add_argument("--swap-model", default="beta", help="model B, on A's GPU (empty: no swap phase)")
    parser.add_argument(
        "--direct-url",
        "--instance-url",
        dest="direct_url",
        metavar="URL",
        help="with --url: one llama-server serving model A, measured side by side with the router",
    )
    parser.add_argument("--llamacpp-url", help="with --url: llama.cpp router mode serving A and B")
    parser.add_argument("--third-model", default="gamma", help="a model on another GPU, for the crowd")
    parser.add_argument(
        "--concurrent", default="16,64", help="comma-separated counts of streams sent at once per target"
    )
    parser.add_argument("--concurrent-rounds", type=int, default=2, help="bursts per level and target")
    parser.add_argument(
        "--concurrent-tokens", type=int, default=32, help="tokens each concurrent stream makes"
    )
    parser.add_argument(
        "--crowd", type=int, default=1000, help="clients sent to the router at once (0: none)"
    )
    parser.add_argument(
        "--router-pid", type=int, help="with --url: the router's pid (CPU, memory, descriptors)"
    )
    parser.add_argument("--llamacpp-pid", type=int, help="with --url: router mode's pid (its CPU per chunk)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)

    document: dict[str, Any] = {"benchmark": "overhead", "settings": settings_of(args)}
    skipped: dict[str, str] = {}
    if args.url:
        document["machine"] = machine_facts()
        urls = {"direct": args.direct_url, "router": args.url, "llamacpp": args.llamacpp_url}
        for key, url in list(urls.items()):
            if not url:
                skipped[key] = "address not given"
        present = {key: url for key, url in urls.items() if url}
        pids = {k: p for k, p in (("router", args.router_pid), ("llamacpp", args.llamacpp_pid)) if p}
        result = trio.run(benchmark, present, skipped, args, pids)
    else:
        if (args.model, args.swap_model) != ("alpha", "beta"):
            parser.error("--model and --swap-model name models of a router given with --url")
        binary = llama_server_binary(args.llama_server)
        document["machine"] = machine_facts(binary)
        with work_directory(args.keep) as work, ExitStack() as stack:
            paths = make_models(work / "models", SHAPES)
            lcpp_dir = work / "llamacpp-models"
            for path in paths.values():
                link_or_copy(path, lcpp_dir / path.name)
            direct = stack.enter_context(
                llama_server_process(work, paths["alpha"], ctx=args.ctx, slots=args.parallel, binary=binary)
            )
            models = {
                name: {
                    "model": str(path),
                    "gpus": [1 if name == "gamma" else 0],
                    "parallel": args.parallel,
                    "ctx": args.ctx,
                }
                for name, path in paths.items()
            }
            router = stack.enter_context(
                router_process(
                    work,
                    models,
                    router={"max_models_per_gpu": 1, "queue_limit": max(1000, args.crowd)},
                    devices={0: DEVICE_MIB, 1: DEVICE_MIB},
                    binary=binary,
                )
            )
            urls = {"direct": direct.url, "router": router.url}
            pids = {"router": router.process.pid}
            try:
                lcpp = stack.enter_context(
                    llamacpp_router_process(
                        work, lcpp_dir, models_max=1, ctx=args.ctx, slots=args.parallel, binary=binary
                    )
                )
                urls["llamacpp"] = lcpp.url
                pids["llamacpp"] = lcpp.process.pid
            except BenchmarkError as exc:
                skipped["llamacpp"] = f"router mode did not start: {exc}"
            document["setup"] = {
                "ctx": args.ctx,
                "parallel": args.parallel,
                "threads": 1,
                "shapes": {name: shape_facts(shape) for name, shape in SHAPES.items()},
                "router": {"max_models_per_gpu": 1, "devices": {"0": DEVICE_MIB, "1": DEVICE_MIB}},
                "llamacpp": {"models_max": 1, "models_dir": "A and B as NAME.gguf"},
            }
            result = trio.run(benchmark, urls, skipped, args, pids)
    document["result"] = result
    level = max((int(v) for v in args.concurrent.split(",") if v.strip()), default=0)
    document["goals"] = goals_document(evaluate(result, level))
    report(result, level)
    path = write_result(args.name or "overhead", document)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
