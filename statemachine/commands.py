"""Outputs of ``step()``. The shell carries them out and reports results back as events."""

from __future__ import annotations

import enum

import attrs


@attrs.frozen
class Spawn:
    """Start replica ``replica`` of ``model`` on ``gpus``.

    ``request``: the waiting request whose placement started the load; None for a load at ``Startup``.
    ``reason`` says the same in words, for logs and /status; no code reads it.
    """

    replica: int
    model: str
    gpus: tuple[int, ...]
    reason: str
    request: int | None = None


class KillCause(enum.StrEnum):
    """Why the scheduler stops a replica."""

    EVICTED = "evicted"  # making room for a model to load (the Kill's ``eviction`` says which)
    IDLE_TTL = "idle_ttl"  # idle for its model's ttl
    UNLOADED = "unloaded"  # an unload request (idle, or busy and forced)
    DRAINED = "drained"  # a draining replica (unload, reload, refused dispatch) has nothing left in flight
    RELOAD = "reload"  # a reload removed or restarted its model while it was idle
    LOAD_FAILED = "load_failed"  # its load failed
    UNRESPONSIVE = "unresponsive"  # it stopped answering its health probe
    SHUTDOWN = "shutdown"  # the router is shutting down and it is idle
    DEADLINE = "deadline"  # the shutdown deadline is due and it is still busy


@attrs.frozen
class Eviction:
    """What an eviction makes room for: ``model`` to load on ``gpus``, the victim chosen by ``policy``."""

    model: str
    gpus: tuple[int, ...]
    policy: str


@attrs.frozen
class Kill:
    """Stop replica ``replica`` (SIGTERM, then SIGKILL); a ReplicaExited follows.

    ``cause`` is why; ``eviction`` is set exactly when the cause is ``EVICTED``. ``reason`` says the same in
    words, for logs, /status and error messages; no code reads it.
    """

    replica: int
    model: str
    reason: str
    cause: KillCause
    eviction: Eviction | None = None


@attrs.frozen
class Dispatch:
    """Send request ``rid`` to ``replica``, which serves ``model`` (a pool member for pooled requests)."""

    rid: int
    replica: int
    model: str


@attrs.frozen
class Forward:
    """Send request ``rid`` to ``peer``, which serves ``model`` (a peer model, or a pool member that is one).
    The exchange ends with RequestFinished, ClientGone or PeerFailed, like a dispatch."""

    rid: int
    peer: str
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


Command = Spawn | Kill | Dispatch | Forward | Reject | WakeAt | Stopped
