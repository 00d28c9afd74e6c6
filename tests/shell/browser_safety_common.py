"""What the browser-safety tests share: the model they serve, a foreign and an allowed origin, and counts
of the requests that reached the simulated replicas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.support.client import chat_body
from tests.support.harness import RouterHandle
from tests.support.waiting import until

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
    await until(lambda: request_lines(h, path) >= count, timeout=5, what=f"{count} request(s) for {path}")


async def allowed_chat_after(h: RouterHandle) -> None:
    """One chat request with no Origin, served: the event a test waits for instead of waiting to see that
    refused requests reach nothing. What the router did for the requests before it (an admin action
    through the owner, a request to a replica) came before it; the replica logs it as one more chat."""
    lines = request_lines(h, "/v1/chat/completions")
    assert (await h.client.post("/v1/chat/completions", json=chat_body("alpha"))).status_code == 200
    await wait_lines(h, "/v1/chat/completions", lines + 1)
