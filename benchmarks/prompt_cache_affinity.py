"""The replica-affinity pass of bench_prompt_cache (``--pass affinity``).

One model with two single-slot replicas, several conversations at once (each turn appends the reply and a new
question, with a short random pause between turns), and the cached share cache_n / (cache_n + prompt_n) over
every turn after the first. Without ``--url`` it runs twice, on a router with prefix affinity and on one with
``prefix_affinity = false`` (least-busy routing), and writes outputs/benchmark-prompt-cache-affinity.json;
with ``--url`` it measures that router as configured (``--models A``: the model; it should have two
replicas).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from benchmarks.results import machine_facts, ms, print_table, settings_of, write_result
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
# One request of a benchmark: (client, step, round, body) -> (the measured row, the reply's text).
Send = Callable[[httpx.AsyncClient, str, int, dict[str, Any]], Awaitable[tuple[dict[str, Any], str]]]


AFFINITY_MODES = {"affinity": True, "least busy": False}


async def ready_replicas(client: httpx.AsyncClient, model: str) -> int:
    status = await fetch_json(client, "/status")
    return sum(1 for r in status["replicas"] if r["model"] == model and r["state"] == "ready")


async def affinity_traffic(url: str, args: argparse.Namespace, send: Send) -> dict[str, Any]:
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


def run_affinity(args: argparse.Namespace, send: Send, shape: TinyShape) -> int:
    """The affinity pass: against ``--url`` as configured, or on two routers started here, one per mode."""
    document: dict[str, Any] = {"benchmark": "prompt-cache-affinity", "settings": settings_of(args)}
    runs: dict[str, dict[str, Any]] = {}
    if args.url:
        document["machine"] = machine_facts()
        document["target"] = {"url": args.url}
        runs["as configured"] = trio.run(affinity_traffic, args.url, args, send)
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
            "models": {"alpha": {**table, "shape": shape_facts(shape)}},
            "threads": 1,
        }
        with work_directory(args.keep) as work:
            paths = make_models(work / "models", {"alpha": shape})
            models = {"alpha": {"model": str(paths["alpha"]), **table}}
            for mode, on in AFFINITY_MODES.items():
                router = {"prefix_affinity": on}
                devices = {0: DEVICE_MIB}
                with router_process(work, models, router=router, devices=devices, binary=binary) as service:
                    runs[mode] = trio.run(affinity_traffic, service.url, args, send)
    document["result"] = runs
    affinity_report(runs)
    path = write_result(args.name or "prompt-cache-affinity", document)
    print(f"wrote {path}")
    return 0
