"""What the browser-safety tests share: the model they serve, a foreign and an allowed origin, and counts
of the requests that reached the simulated replicas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from tests.support.harness import RouterHandle

MODELS: Mapping[str, Mapping[str, Any]] = {"alpha": {"sim": {"tokens": 4}}}
EVIL = "http://evil.example"
APP = "http://localhost:3000"


def request_lines(h: RouterHandle, path: str) -> int:
    """How many requests for ``path`` the replicas logged (the simulator logs each one it answers)."""
    return sum(
        1
        for replica in h.router.state.replicas
        for line in h.router.supervisor.logs(replica.id)
        if f"request: POST {path} " in line
    )


def replicas_now(h: RouterHandle) -> list[tuple[int, str]]:
    return [(r.id, r.phase) for r in h.router.state.replicas]


async def wait_lines(h: RouterHandle, path: str, count: int) -> None:
    with trio.fail_after(5):
        while request_lines(h, path) < count:
            await trio.sleep(0.02)
