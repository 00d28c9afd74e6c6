"""Outputs of ``step()``. The shell carries them out and reports results back as events."""

from __future__ import annotations

import enum

import attrs


@attrs.frozen
class Spawn:
    """Start replica ``replica`` of ``model`` on ``gpus``.

    ``request``: the waiting request whose placement started the load; None for a load at ``Startup`` or one
    asked for by ``LoadRequested``.
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
    ABANDONED = "abandoned"  # still loading, and every request that waited for it has left


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


class RejectCode(enum.StrEnum):
    """Why the scheduler ends a request with an error. The HTTP status and error type each one is answered
    with are the shell's to choose (one table in ``router.http.errors``); the scheduler names the fact."""

    QUEUE_FULL = "queue_full"  # the waiting queue is at its bound
    KEY_QUEUE_FULL = "key_queue_full"  # its key has max_queued requests waiting (the key's own bound)
    MODEL_NOT_FOUND = "model_not_found"  # no model or pool of that name (on arrival, or removed by a reload)
    MODEL_UNAVAILABLE = "model_unavailable"  # nothing can serve the request now or get a replica for it
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # more tokens than any candidate's slot holds
    LOAD_FAILED = "load_failed"  # the load it waited for failed (the message names the model and why)
    REPLICA_EXITED = "replica_exited"  # the replica serving it exited before it finished
    SHUTTING_DOWN = "shutting_down"  # the router is stopping
    PEER_FAILED = "peer_failed"  # the peer router it was forwarded to failed it
    PEER_UNREACHABLE = "peer_unreachable"  # the peer router it was forwarded to did not answer
    LOOP_DETECTED = "loop_detected"  # forwarded here by a router, and only a peer could serve it


@attrs.frozen
class Reject:
    """End request ``rid`` with an error; for an in-flight request the shell aborts its exchange.
    ``peer_status``: the status a peer answered with, for a request a peer failed (None otherwise)."""

    rid: int
    code: RejectCode
    message: str
    peer_status: int | None = None


@attrs.frozen
class WakeAt:
    """Send a Tick at ``at`` (or soon after): a deadline of the scheduler falls due then."""

    at: float


@attrs.frozen
class Stopped:
    """Shutdown is complete: no replica is left."""


Command = Spawn | Kill | Dispatch | Forward | Reject | WakeAt | Stopped
