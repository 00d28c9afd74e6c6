"""Outputs of ``step()``. The shell carries them out and reports results back as events."""

from __future__ import annotations

import attrs


@attrs.frozen
class Spawn:
    """Start replica ``replica`` of ``model`` on ``gpus``."""

    replica: int
    model: str
    gpus: tuple[int, ...]
    reason: str


@attrs.frozen
class Kill:
    """Stop replica ``replica`` (SIGTERM, then SIGKILL); a ReplicaExited follows."""

    replica: int
    model: str
    reason: str


@attrs.frozen
class Dispatch:
    """Send request ``rid`` to ``replica``, which serves ``model`` (a pool member for pooled requests)."""

    rid: int
    replica: int
    model: str


@attrs.frozen
class Reject:
    """End request ``rid`` with an error; for an in-flight request the shell aborts its exchange."""

    rid: int
    status: int
    code: str
    message: str


@attrs.frozen
class WakeAt:
    """Send a Tick at ``at`` (or soon after): a deadline of the scheduler falls due then."""

    at: float


@attrs.frozen
class Stopped:
    """Shutdown is complete: no replica is left."""


Command = Spawn | Kill | Dispatch | Reject | WakeAt | Stopped
