"""Inputs of ``step()``. The shell turns the world into these; each is a frozen value."""

from __future__ import annotations

import attrs

from .classes import RequestClass
from .settings import Settings


@attrs.frozen
class Tick:
    """The clock moved to ``now`` (seconds, any origin, never backwards)."""

    now: float


@attrs.frozen
class Startup:
    """The router is up: load the models marked pinned or load_on_startup."""


@attrs.frozen
class RequestArrived:
    """A client request for ``target`` (a model or pool name; aliases already resolved).

    ``tokens`` is what the request needs in one slot (prompt + requested output), None when unknown.
    ``prefix`` is a chain of hashes of the request's leading content in fixed-size blocks: ``prefix[i]``
    stands for the first i+1 blocks, so two requests share their first k blocks exactly when their chains
    share their first k elements. Empty when unknown; it only steers which free replica is chosen.
    """

    rid: int
    target: str
    tokens: int | None = None
    prefix: tuple[int, ...] = ()
    local_only: bool = False  # it came through another router: no peer may serve it (no second hop)
    key: str = ""  # the name of its client's key ("": anonymous); fair share is kept per key
    klass: RequestClass = RequestClass.STANDARD  # its priority class (already lowered as it asked)
    outside: frozenset[str] = frozenset()  # members of a pool its key may not use: never its candidates
    # Its client's keep-alive for the model that serves it (seconds idle before that model is stopped, from
    # its dispatch on; inf: never): None keeps the model's own ttl.
    keep_alive: float | None = None


@attrs.frozen
class ClientGone:
    """The client of ``rid`` disconnected. For a request in flight the shell reports it only once it has
    closed the upstream exchange, so the slot is free."""

    rid: int


@attrs.frozen
class RequestFinished:
    """The upstream exchange of ``rid`` is over (completed or failed). ``broken``: why the replica broke
    off the reply (its connection reset or closed before the reply ended), empty when it did not. A
    replica that broke off a reply is failing: it takes no new work and is stopped once idle, so no
    request is sent to a process that may be dying before its exit is reported."""

    rid: int
    broken: str = ""


@attrs.frozen
class ReplicaReady:
    replica: int


@attrs.frozen
class LoadFailed:
    """A loading replica will not become ready (e.g. /health never answered). Its process must still go."""

    replica: int
    reason: str


@attrs.frozen
class ReplicaUnresponsive:
    """A ready replica stopped answering (its health probe went unanswered for too long): it must take no
    more work and go. A report about a replica already stopping, or gone, changes nothing."""

    replica: int
    reason: str


@attrs.frozen
class ReplicaExited:
    """The replica's process is gone; its memory is free."""

    replica: int
    reason: str


@attrs.frozen
class UnloadRequested:
    """Unload one model (or all when ``model`` is None); ``force`` kills busy replicas too."""

    model: str | None = None
    force: bool = False


@attrs.frozen
class LoadRequested:
    """Load ``model`` ahead of its requests (``POST /models/load``, ``preload``): its missing replicas start
    as soon as they fit, idle residents evicted for them by the policy; waiting requests are placed first. A
    load asked for is never abandoned."""

    model: str


@attrs.frozen
class DispatchFailed:
    """The shell could not reach the replica ``rid`` was dispatched to (connection refused): nothing was
    sent, so the request may wait again."""

    rid: int
    reason: str


@attrs.frozen
class PeerFailed:
    """The peer ``rid`` was forwarded to failed it before any byte reached the client: it could not be
    reached (``down``: the peer is taken out of service until ``PeerState`` says it is up), or it answered
    ``status`` (5xx) with ``reason``. A pooled request tries its next member; any other is answered."""

    rid: int
    reason: str
    down: bool = False
    status: int | None = None


@attrs.frozen
class PeerState:
    """The shell's probe of ``peer`` (its /v1/models): up, or down with ``reason``."""

    peer: str
    up: bool
    reason: str = ""


@attrs.frozen
class SettingsChanged:
    """A new configuration: ``settings`` replace the old ones; replicas of the models in ``restart`` (and of
    models no longer configured) drain and stop, the others keep serving."""

    settings: Settings
    restart: frozenset[str] = frozenset()


@attrs.frozen
class ForeignMemory:
    """Other processes (a desktop, a game, a training job) hold ``bytes`` of ``gpu`` beyond what its budget
    already leaves them (0: no more than that). Loads count them against the budget: a load that no longer
    fits waits, or goes to another card (``gpus = "any"``). Residents are never stopped for them."""

    gpu: int
    bytes: int


@attrs.frozen
class ShutdownRequested:
    """Stop admitting; in-flight work may run until ``deadline``; then everything is killed."""

    deadline: float


@attrs.frozen
class At:
    """The clock moved to ``now`` and then ``event`` happened: the outcome of ``Tick(now)`` followed by
    ``event``, in one step (one working copy of the state instead of two). ``event`` is neither a Tick nor
    another At."""

    now: float
    event: Event


Event = (
    Tick
    | At
    | Startup
    | RequestArrived
    | ClientGone
    | RequestFinished
    | ReplicaReady
    | LoadFailed
    | ReplicaUnresponsive
    | ReplicaExited
    | UnloadRequested
    | LoadRequested
    | DispatchFailed
    | PeerFailed
    | PeerState
    | SettingsChanged
    | ForeignMemory
    | ShutdownRequested
)
