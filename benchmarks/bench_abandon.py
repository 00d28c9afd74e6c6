"""A load abandoned by its client: how long until its GPU is free again.

A simulated llama-server takes 30 s to load; the request that started the load gives up after 1 s (a client
timeout). Measured: the seconds from the client leaving to the moment the router holds no replica of the
model any more (the process has exited, its memory is free), over ``--repeats`` routers.

Prints the figures and writes outputs/benchmark-abandon.json.

    python benchmarks/bench_abandon.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.client import chat_body  # noqa: E402
from tests.support.harness import running_router  # noqa: E402

LOAD_SECONDS = 30.0
GIVE_UP_AFTER = 1.0


async def once(dir: Path) -> float:
    async with running_router(dir, {"a": {"sim": {"load_delay": LOAD_SECONDS}}}) as h:
        with contextlib.suppress(httpx.TimeoutException):
            body = chat_body("a")
            await h.client.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(GIVE_UP_AFTER))
        gone = time.monotonic()
        while h.router.state.replicas:
            await trio.sleep(0.002)
        return time.monotonic() - gone


async def measure(repeats: int) -> list[float]:
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
    seconds = trio.run(measure, args.repeats)
    doc = {
        "load_seconds": LOAD_SECONDS,
        "client_gave_up_after": GIVE_UP_AFTER,
        "freed_after_s": [round(s, 4) for s in seconds],
        "median_s": round(statistics.median(seconds), 4),
    }
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
