"""The scheduler's state: frozen values, derived with ``attrs.evolve`` and persistent maps."""

from __future__ import annotations

import enum

import attrs
from pyrsistent import pmap, pset
from pyrsistent.typing import PMap, PSet

from .classes import RequestClass
from .lanes import TargetQueue
from .settings import ModelSpec, Settings


class RequestPhase(enum.StrEnum):
    """Where a request the scheduler owns stands: waiting in a queue, or sent to a replica's slot."""

    QUEUED = "queued"
    INFLIGHT = "inflight"


class ReplicaPhase(enum.StrEnum):
    """A replica's life: loading until its /health answers, ready, stopping once killed (until it exits)."""

    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"


QUEUED = RequestPhase.QUEUED
INFLIGHT = RequestPhase.INFLIGHT

LOADING = ReplicaPhase.LOADING
READY = ReplicaPhase.READY
STOPPING = ReplicaPhase.STOPPING


@attrs.frozen
class Request:
    """A request the scheduler still owns. Finished, rejected and cancelled requests are dropped."""

    rid: int
    target: str
    tokens: int | None
    arrived: float
    seq: int
    phase: RequestPhase = QUEUED
    replica: int | None = None
    model: str | None = None
    overflow: bool = False
    prefix: tuple[int, ...] = ()
    # Peers: the peer an in-flight request was forwarded to (then ``replica`` is None); the models whose peer
    # failed this request before any byte reached its client (never tried again for it); and whether it came
    # from another router already (then no peer may serve it: a second hop could loop).
    peer: str | None = None
    avoid: frozenset[str] = frozenset()
    local_only: bool = False
    # Who is served first (statemachine/order.py): its client's key name and its priority class.
    key: str = ""
    klass: RequestClass = RequestClass.STANDARD
    # The models its key may not use (members of the pool it asked for, out of the key's scope).
    outside: frozenset[str] = frozenset()
    # The idle time its client asked for the model that serves it (RequestArrived.keep_alive).
    keep_alive: float | None = None

    @property
    def lane(self) -> tuple[int, str]:
        return (int(self.klass), self.key)


@attrs.frozen
class Replica:
    """One llama-server process of ``model``.

    ``draining``: takes no new work and is killed once idle (unload, shutdown). ``forced``: killed while it
    still had requests in flight (shutdown deadline or forced unload). ``memory``: the prefix chains of the
    last requests dispatched to it, most recent first (at most ``affinity_memory`` per slot), none a prefix
    of a more recent one.
    """

    id: int
    model: str
    gpus: tuple[int, ...]
    phase: ReplicaPhase
    spawned_at: float
    ready_at: float | None = None
    asked: bool = False  # started by Startup or LoadRequested, not for a request: never abandoned
    inflight: PSet[int] = attrs.field(factory=pset)
    draining: bool = False
    forced: bool = False
    memory: tuple[tuple[int, ...], ...] = ()


@attrs.frozen
class ReplicaIndex:
    replicas: tuple[Replica, ...]
    settings: Settings
    by_model: dict[str, tuple[int, ...]]
    memo: dict[str, tuple[bool, int]]

    def valid_for(self, state: State) -> bool:
        return self.replicas is state.replicas and self.settings is state.settings


@attrs.frozen
class State:
    settings: Settings
    now: float = 0.0
    requests: PMap[int, Request] = attrs.field(factory=pmap)
    queues: PMap[str, TargetQueue] = attrs.field(factory=pmap)
    waiting: int = 0
    replicas: tuple[Replica, ...] = ()
    next_replica: int = 1
    next_seq: int = 1
    last_used: PMap[str, float] = attrs.field(factory=pmap)
    loaded_at: PMap[str, float] = attrs.field(factory=pmap)
    shutting_down: bool = False
    deadline: float | None = None
    stopped: bool = False
    wake_at: float | None = None
    # Replicas whose model a reload removed or restarted, with the spec they were started with: they drain and
    # stop, and count with that spec until they have exited.
    retired: PMap[int, ModelSpec] = attrs.field(factory=pmap)
    # Models a load of which failed while other replicas of them were still loading or ready: no further
    # replica of them starts until one becomes ready or none is live (failing loads cannot chase each other).
    failing: PSet[str] = attrs.field(factory=pset)
    # Peers: the requests forwarded to each peer and still in flight, and the peers reported down (skipped
    # until reported up again).
    peer_inflight: PMap[str, PSet[int]] = attrs.field(factory=pmap)
    peers_down: PMap[str, str] = attrs.field(factory=pmap)
    # Fair share between keys (statemachine/order.py): each key's finish tag, and the virtual clock.
    fair: PMap[str, float] = attrs.field(factory=pmap)
    vclock: float = 0.0
    # How many requests of each key wait, "" (anonymous) included; keys with none waiting are left out.
    queued_by_key: PMap[str, int] = attrs.field(factory=pmap)
    # Swap batching: how many later requests went past each waiting request that needs a swap, on its GPUs
    # (only requests still waiting are kept), and how long each model's latest load took (spawn to ready).
    overtaken: PMap[int, int] = attrs.field(factory=pmap)
    load_seconds: PMap[str, float] = attrs.field(factory=pmap)
    # Models asked to load (LoadRequested) whose replicas have not all started yet, in the order asked.
    wanted: tuple[str, ...] = ()
    # Model -> the idle time its latest request asked for (RequestArrived.keep_alive), in place of its ttl
    # until its residency ends.
    keep_alive: PMap[str, float] = attrs.field(factory=pmap)
    # GPU -> bytes other processes hold there beyond what its budget leaves them (ForeignMemory): loads
    # count them against the budget; residents are never stopped for them.
    foreign: PMap[int, int] = attrs.field(factory=pmap)
    # A cache for step(): replicas by model and each model's (free slot?, live replicas). Trusted only for the
    # very ``replicas`` tuple and ``settings`` it was built for; never part of equality or repr.
    index: ReplicaIndex | None = attrs.field(default=None, eq=False, repr=False)
    # A cache for step(): each target's lane heads in rank order (statemachine/heads.py), trusted only for
    # the very queue objects it was built for; never part of equality or repr.
    # (A ``statemachine.heads.HeadIndex``, which imports this module: typed here as any object.)
    heads: object = attrs.field(default=None, eq=False, repr=False)

    def spec_of(self, replica: Replica) -> ModelSpec:
        """The spec a replica runs with: the configured one, or the one it kept when a reload retired it."""
        return self.retired.get(replica.id) or self.settings.models[replica.model]


def initial_state(settings: Settings, now: float = 0.0) -> State:
    return State(settings=settings, now=now)
