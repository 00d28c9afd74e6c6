"""The load phases of bench_overhead.py: many concurrent streams (aggregate chunk rate and the CPU a router
spends per relayed chunk), and a crowd of clients at once (all answered; memory and descriptors afterwards).

CPU, memory and descriptors are read from ``/proc/PID`` of the router process itself (its llama-server
children are separate processes and not counted), before and after each measured stretch.
"""

from __future__ import annotations

import os
import random
import resource
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from benchmarks.workload import StreamResult, async_client, chat_body, stream_chat

CHAT_PATH = "/v1/chat/completions"
_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_WITHIN = 10.0  # most seconds to wait after a crowd for the router's descriptors to come back
IDLE_SETTLE = 5.0  # seconds after the warm-up requests: the router closes connections idle for 4 s


@attrs.frozen
class ProcSample:
    """One reading of a process: CPU seconds (user + system), resident bytes, open descriptors."""

    cpu_s: float
    rss_bytes: int
    fds: int


def proc_sample(pid: int) -> ProcSample | None:
    """``pid``'s CPU time, RSS and open descriptors from /proc; None where they cannot be read."""
    base = Path(f"/proc/{pid}")
    try:
        stat = (base / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
        rss = 0
        for line in (base / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        fds = len(os.listdir(base / "fd"))
    except (OSError, ValueError, IndexError):
        return None
    return ProcSample(cpu, rss, fds)


def raise_file_limit(wanted: int) -> None:
    """Let this process open ``wanted`` descriptors (a crowd of clients needs one each)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# -------------------------------------------------------------------------------------- concurrent streams


async def _streams_at_once(
    client: httpx.AsyncClient, model: str, count: int, tokens: int
) -> tuple[list[StreamResult], list[str], float]:
    results: list[StreamResult] = []
    failures: list[str] = []
    body = chat_body(model, tokens, "Tell me a story", stream=True)

    async def one() -> None:
        try:
            result = await stream_chat(client, body, CHAT_PATH)
        except httpx.HTTPError as exc:
            failures.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        if result.status == 200:
            results.append(result)
        else:
            failures.append(f"status {result.status}")

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return results, failures, time.perf_counter() - started


async def concurrent_phase(
    urls: Mapping[str, str],
    pids: Mapping[str, int],
    model: str,
    levels: Sequence[int],
    tokens: int,
    rounds: int,
    rng: random.Random,
) -> dict[str, dict[str, Any]]:
    """For each level, ``rounds`` bursts of ``level`` concurrent streams per target (targets shuffled each
    round): aggregate content chunks per second of the wall clock, and for a target whose pid is known the
    CPU seconds its process spent per 1,000 relayed chunks."""
    out: dict[str, dict[str, Any]] = {}
    for level in levels:
        raise_file_limit(4 * level + 256)
        chunks = {key: 0 for key in urls}
        wall = {key: 0.0 for key in urls}
        cpu = {key: 0.0 for key in urls}
        failures: dict[str, list[str]] = {key: [] for key in urls}
        for _ in range(rounds):
            for key in rng.sample(list(urls), len(urls)):
                async with async_client(urls[key], timeout=300.0) as client:
                    before = proc_sample(pids[key]) if key in pids else None
                    results, failed, seconds = await _streams_at_once(client, model, level, tokens)
                    after = proc_sample(pids[key]) if key in pids else None
                chunks[key] += sum(r.chunks for r in results)
                wall[key] += seconds
                failures[key] += failed
                if before is not None and after is not None:
                    cpu[key] += after.cpu_s - before.cpu_s
        out[str(level)] = {
            key: {
                "streams": level * rounds,
                "chunks": chunks[key],
                "seconds": wall[key],
                "chunks_per_s": chunks[key] / wall[key] if wall[key] > 0 else None,
                "cpu_s": cpu[key] if key in pids else None,
                "cpu_s_per_1000_chunks": (
                    1000.0 * cpu[key] / chunks[key] if key in pids and chunks[key] else None
                ),
                "failures": len(failures[key]),
                "errors": failures[key][:5],
            }
            for key in urls
        }
    return out


# ------------------------------------------------------------------------------------------------ crowd


async def crowd_phase(
    url: str, pid: int | None, models: Sequence[str], clients: int, tokens: int, rng: random.Random
) -> dict[str, Any]:
    """``clients`` requests at once, each on its own connection, half of them streamed, each naming one of
    ``models`` at random (models sharing a GPU swap). Reported: answers by status, failures, the wall time,
    and the router's RSS and open descriptors before, at the peak seen, and after (connections closed)."""
    raise_file_limit(2 * clients + 256)
    plan = [(rng.choice(list(models)), rng.random() < 0.5) for _ in range(clients)]
    statuses: dict[str, int] = {}
    errors: list[str] = []
    peak = {"rss_bytes": 0, "fds": 0}
    # One request per model first, so that the replicas the crowd leaves resident (each holds a pipe, a log
    # file and a process handle) are resident at the start too: the comparison is of the crowd's own cost.
    async with httpx.AsyncClient(base_url=url, timeout=600.0) as warm:
        for model in models:
            await warm.post(CHAT_PATH, json=chat_body(model, tokens))
    await trio.sleep(IDLE_SETTLE)
    before = proc_sample(pid) if pid is not None else None

    async def one(model: str, stream: bool) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=limits) as client:
            try:
                if stream:
                    result = await stream_chat(client, chat_body(model, tokens, stream=True), CHAT_PATH)
                    status = result.status
                else:
                    response = await client.post(CHAT_PATH, json=chat_body(model, tokens))
                    status = response.status_code
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                status = 0
        statuses[str(status)] = statuses.get(str(status), 0) + 1

    async def watch(done: trio.Event) -> None:
        while not done.is_set():
            sample = proc_sample(pid) if pid is not None else None
            if sample is not None:
                peak["rss_bytes"] = max(peak["rss_bytes"], sample.rss_bytes)
                peak["fds"] = max(peak["fds"], sample.fds)
            with trio.move_on_after(0.2):
                await done.wait()

    started = time.perf_counter()
    done = trio.Event()
    async with trio.open_nursery() as watcher:
        watcher.start_soon(watch, done)
        async with trio.open_nursery() as nursery:
            for model, stream in plan:
                nursery.start_soon(one, model, stream)
        done.set()
    seconds = time.perf_counter() - started
    # The router closes its side of the clients' connections at once, and the connections it keeps to
    # replicas once they have been idle for a few seconds: read the descriptors every half second until they
    # are back to the start, for at most SETTLE_WITHIN seconds, and report how long that took.
    settle_started = time.perf_counter()
    await trio.sleep(0.5)
    after = proc_sample(pid) if pid is not None else None
    while after is not None and before is not None and after.fds > before.fds:
        if time.perf_counter() - settle_started >= SETTLE_WITHIN:
            break
        await trio.sleep(0.5)
        after = proc_sample(pid)
    settled = time.perf_counter() - settle_started
    answered = statuses.get("200", 0)
    return {
        "clients": clients,
        "streamed": sum(1 for _, s in plan if s),
        "models": list(models),
        "statuses": statuses,
        "answered": answered,
        "errors": errors[:5],
        "seconds": seconds,
        "settle_s": round(settled, 1),
        "before": None if before is None else attrs.asdict(before),
        "peak": peak if pid is not None else None,
        "after": None if after is None else attrs.asdict(after),
        "rss_growth": None if before is None or after is None else after.rss_bytes / before.rss_bytes - 1.0,
        "fds_growth": None if before is None or after is None else after.fds / before.fds - 1.0,
    }


# ----------------------------------------------------------------------------------------------- report


def report_load(result: dict[str, Any], labels: Mapping[str, str], stream_level: int) -> None:
    from benchmarks.overhead_goals import evaluate, goal_rows
    from benchmarks.results import print_table

    rows = []
    for level, targets in (result.get("concurrent") or {}).items():
        base = (targets.get("direct") or {}).get("chunks_per_s")
        for key, stats in targets.items():
            rate = stats["chunks_per_s"]
            cpu = stats["cpu_s_per_1000_chunks"]
            rows.append(
                [
                    level,
                    labels[key],
                    stats["streams"],
                    stats["failures"],
                    stats["chunks"],
                    None if rate is None else f"{rate:.0f}",
                    None if rate is None or not base or key == "direct" else f"{rate / base:.3f}",
                    None if cpu is None else f"{cpu:.4f}",
                ]
            )
    if rows:
        print_table(
            "Overhead: concurrent streams (aggregate)",
            ["at once", "target", "streams", "failed", "chunks", "chunks/s", "vs direct", "CPU s/1000"],
            rows,
        )
    crowd = result.get("crowd")
    if crowd:
        before, peak, after = crowd["before"] or {}, crowd["peak"] or {}, crowd["after"] or {}
        mib = 1024 * 1024
        print_table(
            f"Overhead: {crowd['clients']} clients at once ({crowd['streamed']} streamed, "
            f"models {', '.join(crowd['models'])})",
            [
                "answered 200",
                "statuses",
                "seconds",
                "RSS MiB before/peak/after",
                "fds before/peak/after",
                "after (s)",
            ],
            [
                [
                    crowd["answered"],
                    ", ".join(f"{k}: {v}" for k, v in sorted(crowd["statuses"].items())),
                    f"{crowd['seconds']:.1f}",
                    "/".join(f"{d.get('rss_bytes', 0) / mib:.0f}" for d in (before, peak, after)),
                    "/".join(str(d.get("fds", "-")) for d in (before, peak, after)),
                    f"{crowd.get('settle_s', 0):.1f}",
                ]
            ],
        )
        for error in crowd["errors"][:3]:
            print(f"crowd failure: {error}")
    print_table("Goals", ["goal", "wanted", "measured", "verdict"], goal_rows(evaluate(result, stream_level)))
