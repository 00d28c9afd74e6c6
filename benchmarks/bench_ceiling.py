"""The router's relay ceiling: concurrent streams through the router and straight to a synthetic replica.

The replicas are ``benchmarks/synthetic-llama-server`` (``synthetic_replica.py``): llama-server's flags and
endpoints, chunks shaped and sized as llama-server b11434's, paced at a rate a request asks for, at a small
CPU cost. So what limits a run is the router's relaying, not a model. Two targets serve the same replica
flags: ``direct``, one synthetic replica on a port of its own, and ``router``, ``python -m router`` whose
model runs the synthetic launcher (its own ``llama_server``). For each N streams of R content chunks per
second both targets get the same streams, one phase after the other (which goes first alternates), so that
both see the same machine. Reported per (N, R) and target: delivered chunks per second per stream against
R (the rate loss), the inter-chunk gaps (p50, p99, and what the router adds to direct), time to the first
chunk, the router's CPU seconds per 1,000 relayed chunks (``/proc/PID/stat``) and the chunks per second
that makes on one core, its RSS per stream (peak during the phase minus idle, over N), and the CPU of the
replicas and of this load generator, with the machine's busy share. Writes outputs/benchmark-ceiling.json.

    python benchmarks/bench_ceiling.py [--streams 16,64,128,256] [--rates 25,100] [--seconds 4] [--ramp 1]
        [--rounds 1] [--replicas 1] [--aligned] [--small]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.ceiling_load import (  # noqa: E402
    CpuMeter,
    StreamRecord,
    children,
    peak_rss,
    rss_bytes,
    run_streams,
)
from benchmarks.ceiling_report import goals, report  # noqa: E402
from benchmarks.results import base_parser, machine_facts, percentile, settings_of, write_result  # noqa: E402
from benchmarks.services import router_process, run_service, work_directory  # noqa: E402
from router.placement.synthetic import SyntheticModel, write_header_only  # noqa: E402
from router.shell.ports import free_port  # noqa: E402

LAUNCHER = ROOT / "benchmarks" / "synthetic-llama-server"
# The router starts replicas with --alias NAME, and llama-server puts that name in every chunk: one as long
# as a real model's keeps the chunks as large as a real llama-server's (about 260 bytes).
MODEL = "synthetic-8b-instruct-q4_k_m"
MODEL_FILE = f"{MODEL}.gguf"
CTX_PER_SLOT = 256
IDLE_S = 1.0  # seconds of idle router CPU measured before the phases


@attrs.frozen
class Target:
    """Where one target listens, the pid whose CPU and memory are its relay cost (None: direct), and the
    pids of the replicas behind it."""

    name: str
    host: str
    port: int
    relay_pid: int | None
    replica_pids: tuple[int, ...]


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q)


def phase_stats(records: list[StreamRecord], rate: float, tokens: int) -> dict[str, Any]:
    """What the streams of one phase got: completion, delivered rate per stream, gaps, first chunk."""
    complete = [r for r in records if r.error is None and r.status == 200 and len(r.times) == tokens]
    rates = []
    gaps: list[float] = []
    ttfts = []
    for record in records:
        times = record.times
        if times:
            ttfts.append(times[0] - record.sent)
        if len(times) >= 2 and times[-1] > times[0]:
            rates.append((len(times) - 1) / (times[-1] - times[0]))
            gaps += [b - a for a, b in itertools.pairwise(times)]
    mean_rate = sum(rates) / len(rates) if rates else None
    errors = sorted({r.error or f"status {r.status}" for r in records if r not in complete})
    return {
        "streams": len(records),
        "complete": len(complete),
        "failures": len(records) - len(complete),
        "errors": errors[:5],
        "chunks": sum(len(r.times) for r in records),
        "rate_per_stream": {
            "mean": mean_rate,
            "min": min(rates) if rates else None,
            "p50": _p(rates, 50),
        },
        "rate_loss_pct": None if mean_rate is None else 100.0 * (1.0 - mean_rate / rate),
        "worst_rate_loss_pct": None if not rates else 100.0 * (1.0 - min(rates) / rate),
        "gap_ms": {q: None if not gaps else 1000.0 * (_p(gaps, v) or 0.0) for q, v in GAP_QS.items()},
        "ttft_ms": {q: None if not ttfts else 1000.0 * (_p(ttfts, v) or 0.0) for q, v in TTFT_QS.items()},
    }


GAP_QS = {"p50": 50, "p99": 99, "max": 100}
TTFT_QS = {"p50": 50, "p99": 99}


def spread_of(args: argparse.Namespace, rate: float) -> float:
    """Seconds over which a phase's streams start: ``--ramp``, none with ``--aligned`` (then the replica's
    chunks of all streams fall due together, as a llama-server decoding every slot at once writes them)."""
    return 0.0 if args.aligned else max(args.ramp, 1.0 / rate)


def per_1000(cpu: float | None, chunks: int) -> float | None:
    return None if cpu is None or chunks <= 0 else 1000.0 * cpu / chunks


@attrs.define
class Phase:
    """The raw readings of one or more phases of one target at one (N, R)."""

    records: list[StreamRecord] = attrs.field(factory=list)
    cpu: dict[str, float] = attrs.field(factory=dict)
    peak_rss: int = 0
    phases: int = 0

    def add(self, records: list[StreamRecord], cpu: dict[str, float], peak: int) -> None:
        self.phases += 1
        self.records += records
        self.peak_rss = max(self.peak_rss, peak)
        for key, value in cpu.items():
            self.cpu[key] = self.cpu.get(key, 0.0) + value
        self.cpu["busy_wall"] = self.cpu.get("busy_wall", 0.0) + cpu["busy"] * cpu["wall"]


async def phase(
    target: Target, n: int, rate: float, tokens: int, args: argparse.Namespace, into: Phase
) -> None:
    """N streams of ``tokens`` chunks at ``rate`` to one target, with the CPU and memory it took."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "synthetic_rate": rate,
    }
    relay = [target.relay_pid] if target.relay_pid is not None else []
    replicas = list(target.replica_pids) or (children(target.relay_pid) if target.relay_pid else [])
    meter = CpuMeter({"relay": relay, "replicas": replicas})
    stop = asyncio.Event()
    meter.begin()
    watcher = asyncio.ensure_future(peak_rss(target.relay_pid, stop))
    spread = spread_of(args, rate)
    records = await run_streams(target.host, target.port, body, n, spread, tokens / rate * 3 + 15.0)
    cpu = meter.end()
    stop.set()
    into.add(records, cpu, await watcher)


def target_stats(
    target: Target, got: Phase, n: int, rate: float, tokens: int, idle_rss: int | None, spread: float
) -> dict[str, Any]:
    stats = phase_stats(got.records, rate, tokens)
    cpu, chunks, peak = got.cpu, stats["chunks"], got.peak_rss
    relay_cpu = cpu["relay"] if target.relay_pid is not None else None
    # How long the phases should have taken (the starts spread over ``spread`` seconds, then every
    # chunk on time) against how long they took: the share of N·R the target did not deliver.
    ideal = got.phases * (spread * (n - 1) / n + (tokens - 1) / rate)
    stats.update(
        wall_s=cpu["wall"],
        chunks_per_s=chunks / cpu["wall"] if cpu["wall"] > 0 else None,
        aggregate_loss_pct=100.0 * (1.0 - ideal / cpu["wall"]) if cpu["wall"] > 0 else None,
        relay_cpu_s=relay_cpu,
        relay_cpu_s_per_1000=per_1000(relay_cpu, chunks),
        replica_cpu_s_per_1000=per_1000(cpu["replicas"], chunks),
        generator_cpu_s_per_1000=per_1000(cpu["generator"], chunks),
        generator_cpu_share=cpu["generator"] / cpu["wall"] if cpu["wall"] > 0 else None,
        machine_busy_share=cpu["busy_wall"] / cpu["wall"] if cpu["wall"] > 0 else None,
        rss_peak_bytes=peak or None,
        rss_per_stream_bytes=None if not peak or idle_rss is None else (peak - idle_rss) / n,
    )
    stats["chunks_per_s_per_core"] = (
        None if not stats["relay_cpu_s_per_1000"] else 1000.0 / stats["relay_cpu_s_per_1000"]
    )
    return stats


async def idle_reading(target: Target) -> dict[str, Any]:
    """The router's RSS and CPU seconds per second while nothing is asked of it."""
    if target.relay_pid is None:
        return {}
    meter = CpuMeter({"relay": [target.relay_pid]})
    meter.begin()
    await asyncio.sleep(IDLE_S)
    cpu = meter.end()
    return {"rss_bytes": rss_bytes(target.relay_pid), "cpu_s_per_s": cpu["relay"] / cpu["wall"]}


async def benchmark(targets: list[Target], args: argparse.Namespace) -> dict[str, Any]:
    streams = [int(v) for v in args.streams.split(",") if v.strip()]
    rates = [float(v) for v in args.rates.split(",") if v.strip()]
    for target in targets:  # warm-up: the router imports and connects on its first streams
        await phase(target, 2, max(rates), max(int(max(rates) * 0.3), 4), args, Phase())
    router = next((t for t in targets if t.relay_pid is not None), None)
    idle = await idle_reading(router) if router is not None else {}
    points = []
    flip = False
    for rate in rates:
        for n in streams:
            tokens = max(int(rate * args.seconds), 2)
            point: dict[str, Any] = {"streams": n, "rate": rate, "offered": n * rate, "tokens": tokens}
            got = {target.name: Phase() for target in targets}
            for _ in range(args.rounds):
                order = targets[::-1] if flip else targets
                flip = not flip
                for target in order:
                    await phase(target, n, rate, tokens, args, got[target.name])
            for target in targets:
                point[target.name] = target_stats(
                    target, got[target.name], n, rate, tokens, idle.get("rss_bytes"), spread_of(args, rate)
                )
            if "direct" in point and "router" in point:
                point["added"] = added(point["direct"], point["router"])
            points.append(point)
            print(progress_line(point), file=sys.stderr, flush=True)
    return {"idle": idle, "points": points, **goals(points)}


def added(direct: dict[str, Any], router: dict[str, Any]) -> dict[str, float | None]:
    """What the router adds to direct: gaps and first chunk in ms, rate loss in points of percent."""

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    return {
        "gap_p50_ms": diff(direct["gap_ms"]["p50"], router["gap_ms"]["p50"]),
        "gap_p99_ms": diff(direct["gap_ms"]["p99"], router["gap_ms"]["p99"]),
        "ttft_p50_ms": diff(direct["ttft_ms"]["p50"], router["ttft_ms"]["p50"]),
        "rate_loss_pct": diff(direct["rate_loss_pct"], router["rate_loss_pct"]),
    }


def progress_line(point: dict[str, Any]) -> str:
    parts = [f"N={point['streams']} R={point['rate']:g}"]
    for name in ("direct", "router"):
        stats = point.get(name)
        if stats:
            loss, lost = stats["rate_loss_pct"], stats["aggregate_loss_pct"]
            text = "-" if loss is None else f"{loss:.1f}"
            parts.append(f"{name}: loss {text} % per stream, {lost:.1f} % of N·R, {stats['failures']} failed")
    return "  ".join(parts)


# ------------------------------------------------------------------------------------------------- setup


@contextlib.contextmanager
def local_targets(work: Path, args: argparse.Namespace) -> Iterator[tuple[list[Target], dict[str, Any]]]:
    """A synthetic replica on a port of its own and a router whose model runs synthetic replicas."""
    slots = max(2, *(int(v) for v in args.streams.split(",") if v.strip()))
    longest = max(float(v) for v in args.rates.split(",") if v.strip()) * args.seconds
    ctx_per_slot = max(CTX_PER_SLOT, int(longest) + CTX_PER_SLOT)  # room for the prompt and every chunk
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    (model,) = write_header_only(models / MODEL_FILE, SyntheticModel())
    ctx = slots * ctx_per_slot
    os.environ["SYNTHETIC_PYTHON"] = sys.executable  # inherited by the router and its replicas
    port = free_port()
    argv = [str(LAUNCHER), "--host", "127.0.0.1", "--port", str(port), "-m", str(model)]
    argv += ["-c", str(ctx), "-np", str(slots), "-ngl", "0", "--fit", "off", "-t", "1", "--alias", MODEL]
    table = {
        "model": str(model),
        "llama_server": str(LAUNCHER),
        "parallel": slots,
        "ctx": ctx,
        "num_instance": args.replicas,
    }
    router_table = {"kv_store": False, "queue_limit": 10 * slots + 100, "routing_queue_limit": 10 * slots}
    setup = {"slots": slots, "ctx": ctx, "replicas": args.replicas, "model_path": str(model)}
    with (
        run_service("synthetic replica", argv, f"http://127.0.0.1:{port}", work / "direct.log") as direct,
        router_process(work, {MODEL: table}, router=router_table, binary=LAUNCHER) as router,
    ):
        router_port = int(router.url.rsplit(":", 1)[1])
        targets = [
            Target("direct", "127.0.0.1", port, None, (direct.process.pid,)),
            Target("router", "127.0.0.1", router_port, router.process.pid, ()),
        ]
        yield targets, setup


def remote_targets(args: argparse.Namespace) -> list[Target]:
    """``--url`` (a router serving ``--model`` on synthetic replicas) and ``--direct-url``."""
    targets = []
    for name, url, pid in (("direct", args.direct_url, None), ("router", args.url, args.router_pid)):
        if url:
            host, _, port = url.split("://", 1)[-1].rstrip("/").rpartition(":")
            targets.append(Target(name, host, int(port), pid, ()))
    return targets


def make_parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--streams", default="16,64,128,256", help="comma-separated counts of streams at once"
    )
    parser.add_argument("--rates", default="25,100", help="comma-separated content chunks per second each")
    parser.add_argument("--seconds", type=float, default=4.0, help="how long each stream lasts")
    parser.add_argument("--rounds", type=int, default=1, help="phases per target and (N, R)")
    parser.add_argument("--replicas", type=int, default=1, help="synthetic replicas behind the router")
    parser.add_argument("--ramp", type=float, default=1.0, help="seconds over which a phase's streams start")
    parser.add_argument("--aligned", action="store_true", help="start the streams at once (no ramp)")
    parser.add_argument("--small", action="store_true", help="a short run: 2 streams at 20/s for 1 s")
    parser.add_argument("--direct-url", help="with --url: a synthetic replica, measured side by side")
    parser.add_argument("--router-pid", type=int, help="with --url: the router's pid (its CPU and memory)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.small:
        args.streams, args.rates, args.seconds, args.ramp = "2", "20", 1.0, 0.0
    document: dict[str, Any] = {"benchmark": "ceiling", "settings": settings_of(args)}
    document["machine"] = {**machine_facts(), "replica": "benchmarks/synthetic-llama-server"}
    if args.url:
        document["target"] = {"url": args.url, "direct_url": args.direct_url}
        result = asyncio.run(benchmark(remote_targets(args), args))
    else:
        with work_directory(args.keep) as work, local_targets(work, args) as (targets, setup):
            document["setup"] = setup
            result = asyncio.run(benchmark(targets, args))
    document["result"] = result
    report(result)
    path = write_result(args.name or "ceiling", document)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
