"""A key over its quota costs the others next to nothing: the quiet key's latency, alone and while another key
hammers the router past its ``requests_per_minute``.

One tiny model with two slots; two named keys: ``quiet`` (no limits) and ``hammer`` (``requests_per_minute``,
default 20). The phases alternate, ``--rounds`` times each, so that both see the machine's noise:

    alone       the quiet key sends ``--requests`` short chat requests, one after the other
    hammered    the same, while the hammer key sends requests at ``--rate`` per second from four senders in a
                process of its own, every one of them answered 429

The hammer's quota is spent before the first measured round; as the minute slides, the requests it lets
through again run like any other. Reports the quiet key's latency p50/p90 in both phases, their ratio
(goal: at most 1.10), and the hammer's answers by status. Writes outputs/benchmark-quota.json.

    python benchmarks/bench_quota.py [--rounds 10] [--requests 20] [--rate 100]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import LocalRouter, base_parser, fmt, ms, print_table, run_benchmark, summary
from benchmarks.services import make_models
from router.cli.tinymodel import TinyShape

QUIET, HAMMER = "sk-quiet-bench-0001", "sk-hammer-bench-0002"
GOAL = 1.10


def _body(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0.0,
    }


async def _quiet_round(client: httpx.AsyncClient, model: str, count: int) -> list[float]:
    times: list[float] = []
    headers = {"Authorization": f"Bearer {QUIET}"}
    for _ in range(count):
        started = time.perf_counter()
        reply = await client.post("/v1/chat/completions", json=_body(model), headers=headers)
        reply.raise_for_status()
        times.append(time.perf_counter() - started)
    return times


async def _hammer(url: str, model: str, rate: float) -> None:
    """The hammer, in a process of its own (so that its client's work does not slow the quiet key's client):
    requests at ``rate`` per second from four senders; "ready" on stdout after its first answer; its answers
    by status as one JSON line once SIGTERM arrives."""
    headers = {"Authorization": f"Bearer {HAMMER}"}
    answers: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as client:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:

            async def sender() -> None:
                while True:
                    started = trio.current_time()
                    reply = await client.post("/v1/chat/completions", json=_body(model), headers=headers)
                    if not answers:
                        print("ready", flush=True)
                    answers[reply.status_code] += 1
                    await trio.sleep_until(started + 4.0 / rate)

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(sender)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
    print(json.dumps({str(k): v for k, v in sorted(answers.items())}), flush=True)


class Hammer:
    """The hammer's process for one phase."""

    def __init__(self, url: str, model: str, rate: float) -> None:
        command = [sys.executable, __file__, "--hammer", url, "--model", model, "--rate", str(rate)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def stop(self, answers: Counter[int]) -> None:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=60)
        for status, count in json.loads(out.strip().splitlines()[-1]).items():
            answers[int(status)] += count


async def benchmark(url: str, args: Any) -> dict[str, Any]:
    model = args.model
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        await _quiet_round(client, model, 2)  # loaded and warm
        spent: Counter[int] = Counter()
        headers = {"Authorization": f"Bearer {HAMMER}"}
        while not spent[429]:  # spend the hammer's quota before measuring
            reply = await client.post("/v1/chat/completions", json=_body(model), headers=headers)
            spent[reply.status_code] += 1
        alone: list[float] = []
        hammered: list[float] = []
        answers: Counter[int] = Counter()
        for _ in range(args.rounds):
            alone += await _quiet_round(client, model, args.requests)
            hammer = await trio.to_thread.run_sync(Hammer, url, model, args.rate)
            hammered += await _quiet_round(client, model, args.requests)
            await trio.to_thread.run_sync(hammer.stop, answers)
    quiet_alone, quiet_hammered = summary(alone), summary(hammered)
    ratio = (quiet_hammered["p50"] or 0.0) / (quiet_alone["p50"] or 1.0)
    return {
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "hammer_rate_per_s": args.rate,
        "hammer_requests_per_minute": args.limit,
        "quiet_alone_s": quiet_alone,
        "quiet_hammered_s": quiet_hammered,
        "p50_ratio": ratio,
        "goal_ratio": GOAL,
        "within_goal": ratio <= GOAL,
        "hammer_answers_while_measured": {str(k): v for k, v in sorted(answers.items())},
        "hammer_answers_spending_quota": {str(k): v for k, v in sorted(spent.items())},
    }


def setup_for(limit: int) -> Any:
    def setup(work: Path) -> LocalRouter:
        paths = make_models(work / "models", {"m": TinyShape()})
        models = {"m": {"model": str(paths["m"]), "parallel": 2, "ctx": 2048, "gpus": [0], "pinned": True}}
        keys = {
            "quiet": {"key": QUIET},
            "hammer": {"key": HAMMER, "requests_per_minute": limit},
        }
        target = {
            "models": {"m": {"parallel": 2, "ctx": 2048}},
            "keys": {"hammer": {"requests_per_minute": limit}},
        }
        return LocalRouter(models, target, {0: 2048}, keys=keys)

    return setup


def report(result: dict[str, Any]) -> None:
    alone, hammered = result["quiet_alone_s"], result["quiet_hammered_s"]
    print_table(
        f"The quiet key's latency while another key is refused past its quota (p50 ratio "
        f"{result['p50_ratio']:.3f}, goal <= {GOAL})",
        ["quiet key", "n", "p50 ms", "p90 ms"],
        [
            ["alone", alone["n"], fmt(ms(alone["p50"])), fmt(ms(alone["p90"]))],
            ["while hammered", hammered["n"], fmt(ms(hammered["p50"])), fmt(ms(hammered["p90"]))],
        ],
    )
    print(f"hammer's answers while measured: {result['hammer_answers_while_measured']}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--hammer":
        hammer = argparse.ArgumentParser()
        hammer.add_argument("--hammer")
        hammer.add_argument("--model", default="m")
        hammer.add_argument("--rate", type=float, default=100.0)
        options = hammer.parse_args()
        trio.run(_hammer, options.hammer, options.model, options.rate)
        return 0
    parser = base_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--rate", type=float, default=100.0, help="the hammer's requests per second")
    parser.add_argument("--limit", type=int, default=20, help="the hammer's requests_per_minute")
    parser.add_argument("--model", default="m")
    args = parser.parse_args()
    return run_benchmark("quota", args, benchmark, setup_for(args.limit), report)


if __name__ == "__main__":
    sys.exit(main())
