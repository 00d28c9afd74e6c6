"""A stream its client drops frees its slot at once: two long streams on a two-slot replica, one dropped, two
short requests sent 50 ms later. The first of them takes the dropped stream's slot and must get its first
token within 0.5 s of the drop in every trial; the second waits for that slot once more (the other long
stream holds the second slot), and neither may wait for the other long stream to end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import LocalRouter, base_parser, fmt, ms, print_table, run_benchmark, summary
from benchmarks.services import make_models
from router.cli.tinymodel import TinyShape

GOAL_S = 0.5


def _body(model: str, tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }


async def _first_token(client: httpx.AsyncClient, model: str, since: float) -> float:
    """Seconds from ``since`` to the first content of a short streamed request."""
    async with client.stream("POST", "/v1/chat/completions", json=_body(model, 4, True)) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and '"content"' in line:
                break
    return trio.current_time() - since


async def _trial(client: httpx.AsyncClient, model: str, long_tokens: int) -> tuple[float, float]:
    """One trial: the two short requests' first tokens, in seconds after the drop."""
    async with trio.open_nursery() as nursery:

        async def keep() -> None:
            async with client.stream(
                "POST", "/v1/chat/completions", json=_body(model, long_tokens, True)
            ) as r:
                async for _ in r.aiter_lines():
                    pass

        nursery.start_soon(keep)
        async with client.stream("POST", "/v1/chat/completions", json=_body(model, long_tokens, True)) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 20:
                    break
        dropped = trio.current_time()
        await trio.sleep(0.05)
        waits: list[float] = []

        async def short() -> None:
            waits.append(await _first_token(client, model, dropped))

        async with trio.open_nursery() as shorts:
            shorts.start_soon(short)
            shorts.start_soon(short)
        nursery.cancel_scope.cancel()
    first, second = sorted(waits)
    return first, second


async def _idle(client: httpx.AsyncClient) -> None:
    with trio.fail_after(60):
        while any((await client.get("/status")).json()["queue"] or []):
            await trio.sleep(0.05)
        while any(r.get("in_flight") for r in (await client.get("/status")).json()["replicas"]):
            await trio.sleep(0.05)


async def benchmark(url: str, args: Any) -> dict[str, Any]:
    model = args.model
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        await client.post("/v1/chat/completions", json=_body(model, 2, False))  # loaded before the trials
        firsts: list[float] = []
        seconds: list[float] = []
        for _ in range(args.trials):
            await _idle(client)
            first, second = await _trial(client, model, args.long_tokens)
            firsts.append(first)
            seconds.append(second)
    return {
        "trials": args.trials,
        "within_goal": sum(first <= GOAL_S for first in firsts),
        "goal_s": GOAL_S,
        "first_short_first_token_s": summary(firsts),
        "second_short_first_token_s": summary(seconds),
    }


def setup(work: Path) -> LocalRouter:
    paths = make_models(work / "models", {"m": TinyShape()})
    models = {"m": {"model": str(paths["m"]), "parallel": 2, "ctx": 8448, "gpus": [0]}}
    return LocalRouter(models, {"models": {"m": {"parallel": 2, "ctx": 8448}}}, {0: 2048})


def report(result: dict[str, Any]) -> None:
    rows = []
    for label, key in (("first short (the freed slot)", "first"), ("second short", "second")):
        s = result[f"{key}_short_first_token_s"]
        rows.append([label, fmt(ms(s["p50"])), fmt(ms(s["p99"])), fmt(ms(s["max"]))])
    print_table(
        f"A dropped stream's slot goes to the next request: {result['within_goal']} of {result['trials']} "
        f"trials within {GOAL_S} s",
        ["first token after the drop", "p50 ms", "p99 ms", "max ms"],
        rows,
    )


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--trials", "-n", type=int, default=100)
    parser.add_argument("--long-tokens", type=int, default=4000)
    parser.add_argument("--model", default="m")
    return run_benchmark("dropped-stream", parser.parse_args(), benchmark, setup, report)


if __name__ == "__main__":
    sys.exit(main())
