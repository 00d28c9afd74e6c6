"""A load waited for, then abandoned by its client: its first byte, and how long until its GPU is free again.

A simulated llama-server takes 30 s to load a 64 MiB model file (it maps it and touches its pages over the
load); the streamed request that started the load reads what it is sent for 1 s and then gives up (a client
timeout). Measured over ``--repeats`` routers: the seconds from sending the request to the first byte of its
answer (the first SSE comment, with the load's progress; goal 0.5 s), and from the client leaving to the
moment the router holds no replica of the model any more (the process has exited, its memory is free; goal
1 s).

Prints the figures and writes outputs/benchmark-abandon.json.

    python benchmarks/bench_abandon.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.client import chat_body  # noqa: E402
from tests.support.harness import running_router  # noqa: E402
from tests.support.simtools import write_padded_model  # noqa: E402

LOAD_SECONDS = 30.0
GIVE_UP_AFTER = 1.0
MODEL_MIB = 64


async def once(dir: Path) -> tuple[float, float, list[str]]:
    """Seconds to the first byte, seconds from leaving to a free GPU, and the comments received."""
    model = write_padded_model(dir / "models", "a", MODEL_MIB, load_delay=LOAD_SECONDS)
    async with running_router(dir, {"a": {"model": str(model)}}) as h:
        sent = time.monotonic()
        first = math.nan
        received = b""
        body = {**chat_body("a"), "stream": True}
        with trio.move_on_after(GIVE_UP_AFTER):
            async with h.client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for chunk in response.aiter_raw():
                    first = time.monotonic() - sent if not received else first
                    received += chunk
        gone = time.monotonic()
        while h.router.state.replicas:
            await trio.sleep(0.002)
        comments = [line for line in received.decode().splitlines() if line.startswith(":")]
        return first, time.monotonic() - gone, comments


async def measure(repeats: int) -> list[tuple[float, float, list[str]]]:
    out = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as dir:
            out.append(await once(Path(dir)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = trio.run(measure, args.repeats)
    firsts = [first for first, _, _ in runs]
    freed = [free for _, free, _ in runs]
    doc = {
        "load_seconds": LOAD_SECONDS,
        "client_gave_up_after": GIVE_UP_AFTER,
        "first_byte_s": [round(s, 4) for s in firsts],
        "first_byte_median_s": round(statistics.median(firsts), 4),
        "freed_after_s": [round(s, 4) for s in freed],
        "median_s": round(statistics.median(freed), 4),
        "comments_of_first_run": runs[0][2],
    }
    print(
        f"first byte {doc['first_byte_median_s']} s after sending (median of {args.repeats}): "
        f"{doc['first_byte_s']}"
    )
    print(f"comments: {runs[0][2]}")
    print(
        f"GPU free {doc['median_s']} s (median of {args.repeats}) after the client left: "
        f"{doc['freed_after_s']}"
    )
    out = ROOT / "outputs" / "benchmark-abandon.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
