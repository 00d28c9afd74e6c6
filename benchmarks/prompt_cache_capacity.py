"""The capacity pass of bench_prompt_cache: how many conversations a model keeps, and what that costs.

N conversations to model A each get a first turn, then each is revisited with its next turn. Two ways:

    in RAM    the turns follow each other on A's replica: every conversation but the last lives in
              llama-server's host-RAM prompt cache (``cram``) while the others use the slot
    on disk   every turn is followed by a request to B, which evicts A: each conversation survives in the
              router's saved-state store and is restored when A comes back

For each revisit the pass records the cached share (cache_n / prompt tokens) and the prefill time; for the
RAM pass the replica's resident memory (VmRSS, when the replica runs on this machine), for the disk pass the
store's size (``llama_router_kv_store_bytes``).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import httpx

from benchmarks.workload import chat_body, prompt_text

CHAT_PATH = "/v1/chat/completions"


async def _turn(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    response = await client.post(CHAT_PATH, json=body)
    if response.status_code != 200:
        return {"status": response.status_code, "error": response.text[:300]}, ""
    reply = response.json()
    timings = reply.get("timings") or {}
    cache_n, prompt_n = timings.get("cache_n"), timings.get("prompt_n")
    share = None
    if isinstance(cache_n, int) and isinstance(prompt_n, int) and cache_n + prompt_n:
        share = cache_n / (cache_n + prompt_n)
    row = {"status": 200, "cache_n": cache_n, "prompt_n": prompt_n, "share": share}
    row["prompt_ms"] = timings.get("prompt_ms")
    text = ((reply.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    return row, text


async def _replica_rss_mib(client: httpx.AsyncClient, model: str) -> float | None:
    """Resident memory of the model's replicas, read from /proc (None when they are not on this machine)."""
    status = (await client.get("/status")).json()
    total = 0.0
    found = False
    for replica in status.get("replicas", []):
        if replica.get("model") != model or not replica.get("pid"):
            continue
        try:
            text = Path(f"/proc/{replica['pid']}/status").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024.0
                found = True
    return total if found else None


async def _store_bytes(client: httpx.AsyncClient) -> float | None:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("llama_router_kv_store_bytes "):
            return float(line.split()[1])
    return None


async def _conversations(
    client: httpx.AsyncClient, a: str, b: str | None, args: Any, seed: int
) -> list[dict[str, Any]]:
    """First turns of every conversation, then every next turn; B after each when ``b`` is given."""
    firsts: list[tuple[str, str]] = []
    rows: list[dict[str, Any]] = []
    for i in range(args.held):
        text = f"Conversation {seed + i}. " + prompt_text(args.prompt_words, seed=seed + i)
        row, reply = await _turn(client, chat_body(a, args.tokens, text))
        firsts.append((text, reply))
        rows.append({"turn": "first", "conversation": i, **row})
        if b is not None:
            await _turn(client, chat_body(b, args.tokens, "Hello there"))
    for i, (text, reply) in enumerate(firsts):
        messages = [
            {"role": "user", "content": text},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": prompt_text(args.followup_words, seed=seed + 500 + i)},
        ]
        row, _ = await _turn(client, chat_body(a, args.tokens, messages=messages))
        rows.append({"turn": "revisit", "conversation": i, **row})
        if b is not None:
            await _turn(client, chat_body(b, args.tokens, "Hello again"))
    return rows


def _summary(rows: list[dict[str, Any]], turn: str) -> dict[str, Any]:
    chosen = [r for r in rows if r["turn"] == turn and r["status"] == 200]
    shares = [r["share"] for r in chosen if r.get("share") is not None]
    prefill = [r["prompt_ms"] for r in chosen if r.get("prompt_ms") is not None]
    return {
        "ok": len(chosen),
        "failed": sum(1 for r in rows if r["turn"] == turn and r["status"] != 200),
        "share_median": statistics.median(shares) if shares else None,
        "share_min": min(shares) if shares else None,
        "prompt_ms_median": statistics.median(prefill) if prefill else None,
    }


async def capacity(client: httpx.AsyncClient, a: str, b: str | None, args: Any) -> dict[str, Any]:
    """Both ways (the disk one only when ``b`` shares A's GPU)."""
    result: dict[str, Any] = {"conversations": args.held}
    ram = await _conversations(client, a, None, args, seed=10_000)
    result["ram"] = {
        "first": _summary(ram, "first"),
        "revisit": _summary(ram, "revisit"),
        "replica_rss_mib": await _replica_rss_mib(client, a),
        "requests": ram,
    }
    if b is not None:
        disk = await _conversations(client, a, b, args, seed=20_000)
        result["disk"] = {
            "first": _summary(disk, "first"),
            "revisit": _summary(disk, "revisit"),
            "store_bytes": await _store_bytes(client),
            "requests": disk,
        }
    return result
