"""How much of a prompt llama-server reuses from its cache, seen through the router.

Each round sends a long conversation to model A and then, in order:

    first            the conversation's first request
    repeat           the identical request again
    next turn        the conversation with the reply and a new user message appended
    swap away        a request to model B, which shares A's GPU (one model per GPU): A is evicted
    after eviction   the next-turn request to A again (a fresh replica is loaded, and the router restores
                     the state it saved when A was evicted)
    repeat reloaded  the same request once more
    cache_prompt off the same request with ``"cache_prompt": false``

For each step the table gives the medians over the rounds of ``timings.cache_n`` (prompt tokens taken from
the cache), ``timings.prompt_n`` (prompt tokens evaluated), the reused share cache_n / (cache_n + prompt_n)
and the latency; then the goals (after an eviction >= 90 % of the prompt cached, its prefill <= 1/5 of the
cold one) and the capacity pass (``benchmarks/prompt_cache_capacity.py``: ``--held`` conversations kept in
RAM and on disk, each revisited). Without ``--url`` the router is started on two tiny models on one
declared GPU with ``max_models_per_gpu = 1``; with ``--url`` pass ``--models A,B`` (two models sharing a
GPU), or the first such pair listed is used. Writes outputs/benchmark-prompt-cache.json.

    python benchmarks/bench_prompt_cache.py [--url URL | --host HOST:PORT] [--rounds|-n 3]
        [--prompt-words 600] [--held 6] [--instance-url URL]

``--pass affinity`` measures prefix affinity instead (``benchmarks/prompt_cache_affinity.py``):

    python benchmarks/bench_prompt_cache.py --pass affinity [--conversations 2] [--turns 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.prompt_cache_affinity import run_affinity
from benchmarks.prompt_cache_capacity import capacity
from benchmarks.results import LocalRouter, base_parser, ms, print_table, ratio, run_benchmark
from benchmarks.services import DEVICE_MIB, make_models, shape_facts
from benchmarks.workload import async_client, chat_body, prompt_text, router_models
from router.cli.tinymodel import TinyShape

CHAT_PATH = "/v1/chat/completions"
SHAPES = {
    "alpha": TinyShape(n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=512, seed=1),
    "beta": TinyShape(n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=512, seed=2),
}
STEPS = (
    "first",
    "repeat",
    "next turn",
    "swap away",
    "after eviction",
    "repeat reloaded",
    "cache_prompt off",
)


async def send(
    client: httpx.AsyncClient, step: str, round_: int, body: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """Send ``body``; return the measured row and the reply's text."""
    started = time.perf_counter()
    response = await client.post(CHAT_PATH, json=body)
    latency = time.perf_counter() - started
    row: dict[str, Any] = {
        "step": step,
        "round": round_,
        "model": body["model"],
        "status": response.status_code,
        "latency_s": latency,
    }
    if response.status_code != 200:
        row["error"] = response.text[:300]
        return row, ""
    reply = response.json()
    timings = reply.get("timings") or {}
    usage = reply.get("usage") or {}
    cache_n = timings.get("cache_n")
    prompt_n = timings.get("prompt_n")
    row.update(
        {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": timings.get("prompt_ms"),
            "usage_prompt_tokens": usage.get("prompt_tokens"),
            "usage_cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "reuse": cache_n / (cache_n + prompt_n)
            if isinstance(cache_n, int) and isinstance(prompt_n, int) and cache_n + prompt_n > 0
            else None,
        }
    )
    content = ((reply.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    return row, content


async def model_state(client: httpx.AsyncClient, model: str) -> str | None:
    for entry in await router_models(client):
        if entry["id"] == model:
            return entry.get("state")
    return None


async def one_round(
    client: httpx.AsyncClient, a: str, b: str | None, round_: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    first_text = f"Round {round_}. " + prompt_text(args.prompt_words, seed=1000 + round_)
    first = chat_body(a, args.tokens, first_text)
    row, reply = await send(client, "first", round_, first)
    rows.append(row)
    rows.append((await send(client, "repeat", round_, first))[0])
    follow_up = prompt_text(args.followup_words, seed=2000 + round_)
    turn = chat_body(
        a,
        args.tokens,
        messages=[
            {"role": "user", "content": first_text},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": follow_up},
        ],
    )
    rows.append((await send(client, "next turn", round_, turn))[0])
    if b is not None:
        row, _ = await send(client, "swap away", round_, chat_body(b, args.tokens, "Hello there"))
        row["a_state_after"] = await model_state(client, a)
        rows.append(row)
        rows.append((await send(client, "after eviction", round_, turn))[0])
        rows.append((await send(client, "repeat reloaded", round_, turn))[0])
    rows.append((await send(client, "cache_prompt off", round_, {**turn, "cache_prompt": False}))[0])
    return rows


def pick_models(listed: list[dict[str, Any]], wanted: str | None) -> tuple[str, str | None, str]:
    """Model A, a model B sharing a GPU with A (or None), and how they were chosen."""
    names = [entry["id"] for entry in listed]
    if wanted:
        parts = wanted.split(",")
        missing = [m for m in parts if m not in names]
        if missing:
            raise SystemExit(f"models not served: {missing} (served: {names})")
        return parts[0], parts[1] if len(parts) > 1 else None, "given"
    for i, first in enumerate(listed):
        for second in listed[i + 1 :]:
            if set(first.get("gpus") or ()) & set(second.get("gpus") or ()):
                return first["id"], second["id"], "first pair sharing a GPU"
    return names[0], None, "no two models share a GPU: eviction steps skipped"


async def benchmark(url: str, args: argparse.Namespace) -> dict[str, Any]:
    async with async_client(url) as client:
        listed = await router_models(client)
        a, b, how = pick_models(listed, args.models)
        warm = await client.post(CHAT_PATH, json=chat_body(a, 1, "warm up"))
        warm.raise_for_status()
        rows: list[dict[str, Any]] = []
        for round_ in range(1, args.rounds + 1):
            rows.extend(await one_round(client, a, b, round_, args))
        held = await capacity(client, a, b, args) if args.held > 0 else None
    steps = step_medians(rows)
    result = {
        "model_a": a,
        "model_b": b,
        "chosen": how,
        "steps": steps,
        "goals": goals(steps),
        "capacity": held,
        "requests": rows,
    }
    if args.instance_url:
        # The same conversations straight to one llama-server: no router, so no swap steps.
        direct: list[dict[str, Any]] = []
        async with async_client(args.instance_url) as client:
            warm = await client.post(CHAT_PATH, json=chat_body(a, 1, "warm up"))
            warm.raise_for_status()
            for round_ in range(1, args.rounds + 1):
                direct.extend(await one_round(client, a, None, round_, args))
        result["instance"] = {"url": args.instance_url, "steps": step_medians(direct), "requests": direct}
    return result


def step_medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step, the counts and the medians over the rounds of the successful requests."""
    steps: list[dict[str, Any]] = []
    for step in STEPS:
        chosen = [r for r in rows if r["step"] == step and r["status"] == 200]
        if not any(r["step"] == step for r in rows):
            continue

        def median(key: str, chosen: list[dict[str, Any]] = chosen) -> float | None:
            values = [r[key] for r in chosen if r.get(key) is not None]
            return statistics.median(values) if values else None

        entry = {
            "step": step,
            "ok": len(chosen),
            "failed": sum(1 for r in rows if r["step"] == step and r["status"] != 200),
            "cache_n": median("cache_n"),
            "prompt_n": median("prompt_n"),
            "reuse": median("reuse"),
            "latency_s": median("latency_s"),
            "prompt_ms": median("prompt_ms"),
        }
        if step == "swap away":
            entry["a_evicted"] = sum(1 for r in chosen if r.get("a_state_after") != "ready")
        steps.append(entry)
    return steps


def goals(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The prompt-cache goals: after an eviction at least 90 % of the prompt comes from the cache, and the
    prefill of the returning turn takes at most a fifth of the cold prefill of the first turn."""
    by_step = {step["step"]: step for step in steps}
    after, first = by_step.get("after eviction"), by_step.get("first")
    if after is None or first is None:
        return {}
    prefill = ratio(after["prompt_ms"], first["prompt_ms"])
    return {
        "after_eviction_reuse": after["reuse"],
        "after_eviction_reuse_met": after["reuse"] is not None and after["reuse"] >= 0.9,
        "prefill_ratio_after_eviction_to_cold": prefill,
        "prefill_ratio_met": prefill is not None and prefill <= 0.2,
    }


def step_rows(steps: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for step in steps:
        reuse = step["reuse"]
        rows.append(
            [
                step["step"],
                step["ok"],
                step["failed"],
                step["cache_n"],
                step["prompt_n"],
                None if reuse is None else 100.0 * reuse,
                step["prompt_ms"],
                ms(step["latency_s"]),
            ]
        )
    return rows


HEADERS = ["step", "ok", "failed", "cache_n", "prompt_n", "reused %", "prompt ms", "latency ms"]


def report(result: dict[str, Any]) -> None:
    b = result["model_b"] or "-"
    print_table(
        f"Prompt cache (model {result['model_a']}, swap partner {b}; medians over rounds)",
        HEADERS,
        step_rows(result["steps"]),
    )
    instance = result.get("instance")
    if instance is not None:
        print_table(
            f"The same, straight to the llama-server at {instance['url']}",
            HEADERS,
            step_rows(instance["steps"]),
        )
    shown: set[str] = set()
    for request in [*result["requests"], *(instance["requests"] if instance else [])]:
        if request["status"] != 200 and request["step"] not in shown:
            shown.add(request["step"])
            print(f"{request['step']} failed ({request['status']}): {request.get('error', '')}")
    for step in result["steps"]:
        if "a_evicted" in step:
            print(
                f"{result['model_a']} was evicted by the swap in {step['a_evicted']} of {step['ok']} rounds\n"
            )
    goal = result.get("goals") or {}
    if goal:
        reuse, prefill = goal["after_eviction_reuse"], goal["prefill_ratio_after_eviction_to_cold"]
        print(
            f"after eviction: {fmt_share(reuse)} of the prompt cached (goal >= 90 %: "
            f"{'met' if goal['after_eviction_reuse_met'] else 'NOT met'}); prefill "
            f"{'-' if prefill is None else f'{prefill:.3f}'}x the cold one (goal <= 0.2: "
            f"{'met' if goal['prefill_ratio_met'] else 'NOT met'})\n"
        )
    held = result.get("capacity")
    if held:
        rows = []
        for way in ("ram", "disk"):
            if way not in held:
                continue
            revisit = held[way]["revisit"]
            memory = held[way].get("replica_rss_mib")
            stored = held[way].get("store_bytes")
            rows.append(
                [
                    way,
                    revisit["ok"],
                    revisit["failed"],
                    None if revisit["share_median"] is None else 100.0 * revisit["share_median"],
                    None if revisit["share_min"] is None else 100.0 * revisit["share_min"],
                    revisit["prompt_ms_median"],
                    memory,
                    None if stored is None else stored / (1 << 20),
                ]
            )
        print_table(
            f"Capacity: {held['conversations']} conversations, each revisited once",
            [
                "kept",
                "ok",
                "failed",
                "cached % (median)",
                "cached % (min)",
                "prefill ms",
                "RSS MiB",
                "store MiB",
            ],
            rows,
        )


def fmt_share(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f} %"


def make_parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", "-n", type=int, default=3, help="conversations (one round each)")
    parser.add_argument("--prompt-words", type=int, default=600, help="words in the first message")
    parser.add_argument("--followup-words", type=int, default=30, help="words in the next-turn message")
    parser.add_argument("--tokens", type=int, default=8, help="tokens each reply generates")
    parser.add_argument("--models", help="A,B: the model measured and its swap partner on the same GPU")
    parser.add_argument("--parallel", type=int, default=1, help="slots per replica (self-started router)")
    parser.add_argument("--held", type=int, default=6, help="conversations of the capacity pass (0: skip it)")
    parser.add_argument(
        "--pass",
        dest="which",
        choices=("cache", "affinity"),
        default="cache",
        help="cache: the steps above (default); affinity: conversations on two replicas "
        "(benchmarks/prompt_cache_affinity.py)",
    )
    parser.add_argument("--conversations", type=int, default=2, help="affinity: conversations at once")
    parser.add_argument("--turns", type=int, default=6, help="affinity: turns per conversation")
    parser.add_argument("--pause-ms", type=float, default=300.0, help="affinity: most pause between turns")
    parser.add_argument(
        "--instance-url",
        metavar="URL",
        help="one llama-server serving model A: the steps without a swap run against it too, side by side",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.which == "affinity":
        return run_affinity(args, send, SHAPES["alpha"])

    def setup(work: Path) -> LocalRouter:
        paths = make_models(work / "models", SHAPES)
        ctx = 2048 * args.parallel
        models = {
            name: {"model": str(paths[name]), "gpus": [0], "parallel": args.parallel, "ctx": ctx}
            for name in SHAPES
        }
        router = {"max_models_per_gpu": 1}
        target = {
            "router": router,
            "devices": {"0": DEVICE_MIB},
            "models": {
                name: {**{k: v for k, v in t.items() if k != "model"}, "shape": shape_facts(SHAPES[name])}
                for name, t in models.items()
            },
            "threads": 1,
        }
        return LocalRouter(models, target, {0: DEVICE_MIB}, router)

    return run_benchmark("prompt-cache", args, benchmark, setup, report)


if __name__ == "__main__":
    sys.exit(main())
