"""How much of a prompt llama-server reuses from its cache, seen through the router.

Each round sends a long conversation to model A and then, in order:

    first            the conversation's first request
    repeat           the identical request again
    next turn        the conversation with the reply and a new user message appended
    swap away        a request to model B, which shares A's GPU (one model per GPU): A is evicted
    after eviction   the next-turn request to A again (a fresh replica is loaded)
    repeat reloaded  the same request once more
    cache_prompt off the same request with ``"cache_prompt": false``

For each step the table gives the medians over the rounds of ``timings.cache_n`` (prompt tokens taken from
the cache), ``timings.prompt_n`` (prompt tokens evaluated), the reused share cache_n / (cache_n + prompt_n)
and the latency. Without ``--url`` the router is started on two tiny models on one declared GPU with
``max_models_per_gpu = 1``; with ``--url`` pass ``--models A,B`` (two models sharing a GPU), or the first
such pair listed is used. Writes outputs/benchmark-prompt-cache.json.

    python benchmarks/bench_prompt_cache.py [--url URL] [--rounds 3] [--prompt-words 600]

``--pass affinity`` measures prefix affinity instead: one model with two single-slot replicas, several
conversations at once (each turn appends the reply and a new question, with a short random pause between
turns), and the cached share cache_n / (cache_n + prompt_n) over every turn after the first. Without
``--url`` it runs twice, on a router with prefix affinity and on one with ``prefix_affinity = false``
(least-busy routing), and writes outputs/benchmark-prompt-cache-affinity.json; with ``--url`` it measures
that router as configured (``--models A``: the model; it should have two replicas).

    python benchmarks/bench_prompt_cache.py --pass affinity [--conversations 2] [--turns 6]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import (
    LocalRouter,
    base_parser,
    machine_facts,
    ms,
    print_table,
    run_benchmark,
    settings_of,
    write_result,
)
from benchmarks.services import (
    DEVICE_MIB,
    llama_server_binary,
    make_models,
    router_process,
    shape_facts,
    work_directory,
)
from benchmarks.workload import async_client, chat_body, fetch_json, prompt_text, router_models
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
    return {"model_a": a, "model_b": b, "chosen": how, "steps": steps, "requests": rows}


def report(result: dict[str, Any]) -> None:
    rows = []
    for step in result["steps"]:
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
    b = result["model_b"] or "-"
    print_table(
        f"Prompt cache (model {result['model_a']}, swap partner {b}; medians over rounds)",
        ["step", "ok", "failed", "cache_n", "prompt_n", "reused %", "prompt ms", "latency ms"],
        rows,
    )
    shown: set[str] = set()
    for request in result["requests"]:
        if request["status"] != 200 and request["step"] not in shown:
            shown.add(request["step"])
            print(f"{request['step']} failed ({request['status']}): {request.get('error', '')}")
    for step in result["steps"]:
        if "a_evicted" in step:
            print(
                f"{result['model_a']} was evicted by the swap in {step['a_evicted']} of {step['ok']} rounds\n"
            )


# ------------------------------------------------------------------------------------ replica affinity
AFFINITY_MODES = {"affinity": True, "least busy": False}


async def ready_replicas(client: httpx.AsyncClient, model: str) -> int:
    status = await fetch_json(client, "/status")
    return sum(1 for r in status["replicas"] if r["model"] == model and r["state"] == "ready")


async def affinity_traffic(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--conversations`` conversations of ``--turns`` turns at once against one model; the cached share
    of every turn after the first."""
    async with async_client(url) as client:
        listed = await router_models(client)
        model = args.models.split(",")[0] if args.models else listed[0]["id"]
        warm = await client.post(CHAT_PATH, json=chat_body(model, 1, "warm up"))
        warm.raise_for_status()
        with trio.fail_after(120):
            while await ready_replicas(client, model) < 2:
                await trio.sleep(0.2)
        rows: list[dict[str, Any]] = []

        async def conversation(index: int) -> None:
            pauses = random.Random(5000 + index)
            messages = [
                {
                    "role": "user",
                    "content": f"Conversation {index}. " + prompt_text(args.prompt_words, 3000 + index),
                }
            ]
            for turn in range(1, args.turns + 1):
                await trio.sleep(pauses.uniform(0, args.pause_ms / 1000))
                row, reply = await send(
                    client, f"turn {turn}", index, chat_body(model, args.tokens, messages=messages)
                )
                row.update({"conversation": index, "turn": turn})
                rows.append(row)
                question = prompt_text(args.followup_words, seed=4000 + 100 * index + turn)
                messages = [
                    *messages,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": question},
                ]

        async with trio.open_nursery() as nursery:
            for index in range(1, args.conversations + 1):
                nursery.start_soon(conversation, index)
    later = [r for r in rows if r["turn"] > 1 and r["status"] == 200 and r.get("reuse") is not None]
    cached = sum(r["cache_n"] for r in later)
    total = sum(r["cache_n"] + r["prompt_n"] for r in later)
    return {
        "model": model,
        "turns_measured": len(later),
        "failed": sum(1 for r in rows if r["status"] != 200),
        "cached_share": cached / total if total else None,
        "cache_n": cached,
        "prompt_n": total - cached,
        "latency_s": statistics.median(r["latency_s"] for r in later) if later else None,
        "requests": rows,
    }


def affinity_report(runs: dict[str, dict[str, Any]]) -> None:
    rows = [
        [
            mode,
            run["turns_measured"],
            run["failed"],
            run["cache_n"],
            run["prompt_n"],
            None if run["cached_share"] is None else 100.0 * run["cached_share"],
            ms(run["latency_s"]),
        ]
        for mode, run in runs.items()
    ]
    print_table(
        "Replica affinity (two replicas; turns after the first, all conversations)",
        ["routing", "turns", "failed", "cache_n", "prompt_n", "cached %", "median latency ms"],
        rows,
    )


def run_affinity(args: argparse.Namespace) -> int:
    """The affinity pass: against ``--url`` as configured, or on two routers started here, one per mode."""
    document: dict[str, Any] = {"benchmark": "prompt-cache-affinity", "settings": settings_of(args)}
    runs: dict[str, dict[str, Any]] = {}
    if args.url:
        document["machine"] = machine_facts()
        document["target"] = {"url": args.url}
        runs["as configured"] = trio.run(affinity_traffic, args.url, args)
    else:
        binary = llama_server_binary(args.llama_server)
        document["machine"] = machine_facts(binary)
        ctx = 4096 * args.parallel
        table = {
            "gpus": [0],
            "parallel": args.parallel,
            "ctx": ctx,
            "num_instance": 2,
            "load_on_startup": True,
        }
        document["target"] = {
            "models": {"alpha": {**table, "shape": shape_facts(SHAPES["alpha"])}},
            "threads": 1,
        }
        with work_directory(args.keep) as work:
            paths = make_models(work / "models", {"alpha": SHAPES["alpha"]})
            models = {"alpha": {"model": str(paths["alpha"]), **table}}
            for mode, on in AFFINITY_MODES.items():
                router = {"prefix_affinity": on}
                devices = {0: DEVICE_MIB}
                with router_process(work, models, router=router, devices=devices, binary=binary) as service:
                    runs[mode] = trio.run(affinity_traffic, service.url, args)
    document["result"] = runs
    affinity_report(runs)
    path = write_result(args.name or "prompt-cache-affinity", document)
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="conversations (one round each)")
    parser.add_argument("--prompt-words", type=int, default=600, help="words in the first message")
    parser.add_argument("--followup-words", type=int, default=30, help="words in the next-turn message")
    parser.add_argument("--tokens", type=int, default=8, help="tokens each reply generates")
    parser.add_argument("--models", help="A,B: the model measured and its swap partner on the same GPU")
    parser.add_argument("--parallel", type=int, default=1, help="slots per replica (self-started router)")
    parser.add_argument(
        "--pass",
        dest="which",
        choices=("cache", "affinity"),
        default="cache",
        help="cache: the steps above (default); affinity: conversations on two replicas",
    )
    parser.add_argument("--conversations", type=int, default=2, help="affinity: conversations at once")
    parser.add_argument("--turns", type=int, default=6, help="affinity: turns per conversation")
    parser.add_argument("--pause-ms", type=float, default=300.0, help="affinity: most pause between turns")
    args = parser.parse_args(argv)
    if args.which == "affinity":
        return run_affinity(args)

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
