"""The ceiling of bench_ceiling.py, its goals and its tables.

The ceiling is the largest N·R (streams × chunks per second each) whose streams all came through the router
complete, with a mean per-stream rate loss (chunks per second from a stream's first chunk to its last,
against R) of at most ``MAX_LOSS_PCT``, and a phase that lasted at most that much longer than it should have
(its aggregate loss: streams that start late lose no rate once begun, but make the phase longer).

The goals are printed as met or not met, never asserted: the router's CPU per 1,000 relayed chunks at the
ceiling, and the p99 inter-chunk gap it adds at the largest N·R this machine generates (the largest whose
direct streams kept their rate).
"""

from __future__ import annotations

from typing import Any

from benchmarks.results import fmt, print_table

MAX_LOSS_PCT = 5.0
CPU_GOAL = 0.066  # CPU-seconds per 1,000 relayed chunks
GAP_GOAL_MS = 2.0  # p99 inter-chunk gap added
BUSY = 0.95  # the machine's busy share from which its CPUs count as saturated
GENERATOR_BUSY = 0.9  # this process's CPU share from which the generator counts as the limit


def carried(stats: dict[str, Any] | None) -> bool:
    """Every stream complete, each at its rate once it began, and the phase as a whole on time."""
    if stats is None or stats["failures"] or stats["rate_loss_pct"] is None:
        return False
    return stats["rate_loss_pct"] <= MAX_LOSS_PCT and stats["aggregate_loss_pct"] <= MAX_LOSS_PCT


def limit_of(point: dict[str, Any]) -> str:
    """What most likely held a point back that the router did not carry."""
    router, direct = point.get("router") or {}, point.get("direct")
    if direct is not None and not carried(direct):
        return "the generator or the replica (direct streams lost their rate too)"
    if (router.get("generator_cpu_share") or 0.0) >= GENERATOR_BUSY:
        return "the load generator (a core of its own used up)"
    if (router.get("machine_busy_share") or 0.0) >= BUSY:
        return "the machine's CPUs (all busy: router, replica and generator share them)"
    return "the router"


def goals(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The ceiling and the goals, from the measured points."""
    held = [p for p in points if carried(p.get("router"))]
    best = max(held, key=lambda p: p["offered"], default=None)
    above = [
        p
        for p in points
        if not carried(p.get("router")) and p["offered"] > (best or {"offered": 0})["offered"]
    ]
    failed = min(above, key=lambda p: p["offered"], default=None)
    cpu = None if best is None else best["router"]["relay_cpu_s_per_1000"]
    # More streams cost the router more than more chunks per stream (each stream's start is work of its
    # own), so a smaller N·R with more streams may fail below the ceiling: those are listed.
    below = [
        p
        for p in points
        if not carried(p.get("router")) and best is not None and p["offered"] <= best["offered"]
    ]
    ceiling = {
        "max_loss_pct": MAX_LOSS_PCT,
        "streams": None if best is None else best["streams"],
        "rate": None if best is None else best["rate"],
        "chunks_per_s": None if best is None else best["offered"],
        "reached": failed is not None,
        "next_failed": None if failed is None else {"streams": failed["streams"], "rate": failed["rate"]},
        "limit": None if failed is None else limit_of(failed),
        "failed_below": [{"streams": p["streams"], "rate": p["rate"], "limit": limit_of(p)} for p in below],
        "cpu_s_per_1000_chunks": cpu,
        "chunks_per_s_one_core": None if not cpu else 1000.0 / cpu,
    }
    generated = [p for p in points if carried(p.get("direct")) and p.get("added")]
    top = max(generated, key=lambda p: p["offered"], default=None)
    gap = None if top is None else top["added"]["gap_p99_ms"]
    judged = [
        {
            "goal": "router CPU per 1,000 relayed chunks (at the ceiling)",
            "wanted": f"<= {CPU_GOAL} s",
            "measured": None if cpu is None else round(cpu, 4),
            "verdict": verdict(cpu, CPU_GOAL),
        },
        {
            "goal": "p99 inter-chunk gap added (largest N·R generated"
            + ("" if top is None else f": {top['streams']} x {top['rate']:g}/s")
            + ")",
            "wanted": f"<= {GAP_GOAL_MS} ms",
            "measured": None if gap is None else round(gap, 2),
            "verdict": verdict(gap, GAP_GOAL_MS),
        },
    ]
    return {"ceiling": ceiling, "goals": judged}


def verdict(value: float | None, bound: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= bound else "not met"


RATE_HEADERS = (
    *("N x R", "target", "complete", "chunks/s", "loss %", "worst %", "N·R loss %"),
    *("gap p50", "gap p99", "gap max", "TTFT p50", "TTFT p99"),
)
COST_HEADERS = (
    *("N x R", "N·R", "gap p50 +ms", "gap p99 +ms", "TTFT p50 +ms", "router CPU s/1000", "chunks/s/core"),
    *("RSS KiB/stream", "replica CPU s/1000", "gen CPU s/1000", "gen share", "busy"),
)


def _kib(value: float | None) -> float | None:
    return None if value is None else value / 1024.0


def report(result: dict[str, Any]) -> None:
    points = result["points"]
    rows = []
    for p in points:
        for name in ("direct", "router"):
            s = p.get(name)
            if s is None:
                continue
            rows.append(
                [
                    f"{p['streams']} x {p['rate']:g}/s",
                    name,
                    f"{s['complete']}/{s['streams']}",
                    s["rate_per_stream"]["mean"],
                    s["rate_loss_pct"],
                    s["worst_rate_loss_pct"],
                    s["aggregate_loss_pct"],
                    s["gap_ms"]["p50"],
                    s["gap_ms"]["p99"],
                    s["gap_ms"]["max"],
                    s["ttft_ms"]["p50"],
                    s["ttft_ms"]["p99"],
                ]
            )
    print_table(
        "Ceiling: per-stream rate, inter-chunk gaps and first chunk (ms)",
        [*RATE_HEADERS],
        [[r[0], r[1], r[2], *(fmt(v, 2) for v in r[3:])] for r in rows],
    )
    rows = []
    for p in points:
        r, d, a = p.get("router") or {}, p.get("direct") or {}, p.get("added") or {}
        rows.append(
            [
                f"{p['streams']} x {p['rate']:g}/s",
                fmt(p["offered"], 0),
                fmt(a.get("gap_p50_ms"), 2),
                fmt(a.get("gap_p99_ms"), 2),
                fmt(a.get("ttft_p50_ms"), 2),
                fmt(r.get("relay_cpu_s_per_1000"), 4),
                fmt(r.get("chunks_per_s_per_core"), 0),
                fmt(_kib(r.get("rss_per_stream_bytes")), 1),
                fmt(d.get("replica_cpu_s_per_1000"), 4),
                fmt(r.get("generator_cpu_s_per_1000"), 4),
                fmt(r.get("generator_cpu_share"), 2),
                fmt(r.get("machine_busy_share"), 2),
            ]
        )
    print_table(
        "Ceiling: what the router adds and costs (router phase; replica CPU from the direct phase)",
        [*COST_HEADERS],
        rows,
    )
    idle = result.get("idle") or {}
    c = result["ceiling"]
    reach = "not reached (above the largest N·R measured)"
    if c["reached"]:
        failed = c["next_failed"]
        reach = f"{failed['streams']} x {failed['rate']:g}/s failed; limit: {c['limit']}"
    print_table(
        f"Ceiling (per-stream and N·R loss <= {c['max_loss_pct']:g} %, every stream complete)",
        ["N·R", "N x R", "router CPU s/1000", "chunks/s on one core", "next", "idle RSS MiB", "idle CPU s/s"],
        [
            [
                fmt(c["chunks_per_s"], 0),
                "-" if c["streams"] is None else f"{c['streams']} x {c['rate']:g}/s",
                fmt(c["cpu_s_per_1000_chunks"], 4),
                fmt(c["chunks_per_s_one_core"], 0),
                reach,
                fmt(None if idle.get("rss_bytes") is None else idle["rss_bytes"] / 2**20, 0),
                fmt(idle.get("cpu_s_per_s"), 3),
            ]
        ],
    )
    for p in c["failed_below"]:
        print(f"below the ceiling, {p['streams']} x {p['rate']:g}/s failed too; limit: {p['limit']}\n")
    print_table(
        "Goals",
        ["goal", "wanted", "measured", "verdict"],
        [[g["goal"], g["wanted"], fmt(g["measured"], 4), g["verdict"]] for g in result["goals"]],
    )
    for p in points:
        for name in ("direct", "router"):
            for error in (p.get(name) or {}).get("errors", [])[:3]:
                print(f"{p['streams']} x {p['rate']:g}/s {name} failure: {error}")
