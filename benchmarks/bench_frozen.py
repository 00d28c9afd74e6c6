"""A replica that freezes (SIGSTOP stands in for a driver hang): how soon it takes no new work, and how soon
a request sent to it just after it froze is answered by its replacement.

A simulated llama-server with two slots streams a long reply on one; it is stopped, and a request is sent at
once (it takes the frozen replica's free slot). Measured per ``hang_timeout`` (the default, and the 30 s
the router used before): seconds from the stop to the replica leaving the ready replicas (no new work), and
to the late request's answer.

Prints the figures and writes outputs/benchmark-frozen.json.

    python benchmarks/bench_frozen.py [--old 30]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.config.values import RouterSettings  # noqa: E402
from statemachine.state import READY, State  # noqa: E402
from tests.support.client import chat_body, post_chat, start_stream  # noqa: E402
from tests.support.harness import running_router  # noqa: E402

MODELS = {"m": {"parallel": 2, "ctx": 16384, "sim": {"tokens": 4000, "token_rate": 100.0}}}


async def once(dir: Path, hang_timeout: float) -> dict[str, float]:
    """Seconds from the stop to no new work for the frozen replica, and to the late request's answer."""
    async with (
        running_router(dir, MODELS, router={"hang_timeout": hang_timeout}, client_timeout=120.0) as h,
        trio.open_nursery() as nursery,
    ):
        victim = start_stream(nursery, h.client, chat_body("m", max_tokens=4000, stream=True))
        await victim.first_token.wait()
        (replica,) = h.router.state.replicas
        info = h.router.supervisor.info(replica.id)
        assert info is not None and info.pid is not None
        os.kill(info.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        left: list[float] = []

        async def watch() -> None:
            def gone(state: State) -> bool:
                return not any(r.id == replica.id and r.phase == READY for r in state.replicas)

            await h.router.wait_until(gone)
            left.append(time.monotonic() - stopped)

        nursery.start_soon(watch)
        late = await post_chat(h.client, "m", max_tokens=3)
        answered = time.monotonic() - stopped
        while not left:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return {
        "hang_timeout": hang_timeout,
        "no_new_work_after_s": round(left[0], 3),
        "late_request_answered_after_s": round(answered, 3),
        "late_request_status": late.status_code,
    }


async def measure(timeouts: list[float]) -> list[dict[str, float]]:
    out = []
    for timeout in timeouts:
        with tempfile.TemporaryDirectory() as dir:
            out.append(await once(Path(dir), timeout))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=float, default=30.0, help="the earlier default hang_timeout")
    args = parser.parse_args()
    rows = trio.run(measure, [RouterSettings().hang_timeout, args.old])
    for row in rows:
        print(row)
    out = ROOT / "outputs" / "benchmark-frozen.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
