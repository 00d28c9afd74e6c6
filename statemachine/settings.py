"""Static inputs of the scheduler: models, pools, devices and the policy knobs.

These values come from the router's configuration (and, for memory needs, from the placement arithmetic);
the scheduler never changes them.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from pyrsistent import pmap
from pyrsistent.typing import PMap


def _need_converter(value: Mapping[int, int] | None) -> PMap[int, int]:
    return pmap(value or {})


@attrs.frozen
class Placement:
    """One GPU set a model chosen by the scheduler (``ModelSpec.choices``) may run a replica on, with the
    bytes that replica takes on each of those GPUs."""

    gpus: tuple[int, ...]
    need: PMap[int, int] = attrs.field(factory=pmap, converter=_need_converter)


@attrs.frozen
class ModelSpec:
    """One model as the scheduler sees it.

    ``need`` maps a GPU id to the bytes one replica takes there; a GPU missing from it counts as zero (an
    unknown need only counts against the residency cap). ``ctx_per_slot`` is the context one slot holds
    (None: unknown, never a reason to refuse). ``refusal`` is set when placement decided the model can never
    fit its GPUs; requests for it are refused with that text.

    ``choices``: the GPU sets the scheduler may choose from at each load (``gpus = "any"``), each with its
    own need; empty for a model bound to ``gpus``. A model with choices has ``gpus`` = every GPU of its
    choices (``anywhere`` builds it) and no ``need`` of its own; each replica's need is its set's
    (``need_for``). ``spread``: its replicas prefer GPU sets that hold none of it yet.
    """

    name: str
    gpus: tuple[int, ...] = (0,)
    replicas: int = 1
    slots: int = 1
    ctx_per_slot: int | None = None
    need: PMap[int, int] = attrs.field(factory=pmap, converter=_need_converter)
    pinned: bool = False
    ttl: float | None = None
    load_on_startup: bool = False
    refusal: str | None = None
    peer: str | None = None
    choices: tuple[Placement, ...] = ()
    spread: bool = True
    choice_table: dict[tuple[int, ...], Placement] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "choice_table", {c.gpus: c for c in self.choices})

    @classmethod
    def anywhere(
        cls, name: str, choices: tuple[Placement, ...] | list[Placement], **kwargs: object
    ) -> ModelSpec:
        """A model the scheduler places on one of ``choices`` at each load."""
        gpus = tuple(sorted({g for c in choices for g in c.gpus}))
        return cls(name, gpus=gpus, choices=tuple(choices), **kwargs)  # type: ignore[arg-type]

    @property
    def chooses(self) -> bool:
        """Placed by the scheduler at each load (``choices``), not bound to ``gpus``."""
        return bool(self.choices)

    def placed(self, choice: Placement) -> ModelSpec:
        """This model bound to one of its choices, as a load on that set sees it."""
        return attrs.evolve(self, gpus=choice.gpus, need=choice.need, choices=())

    def need_for(self, gpus: tuple[int, ...], gpu: int) -> int:
        """The bytes a replica of this model running on ``gpus`` takes on ``gpu``."""
        if self.choices:
            choice = self.choice_table.get(gpus)
            return 0 if choice is None else choice.need.get(gpu, 0)
        return self.need.get(gpu, 0)

    def runs_on(self, gpus: tuple[int, ...]) -> bool:
        """Whether a replica of this model may run on ``gpus``: its own set, or one of its choices."""
        return gpus in self.choice_table if self.choices else tuple(gpus) == tuple(self.gpus)

    @property
    def remote(self) -> bool:
        """Served by a peer router (``peer``): no replica of it ever runs here."""
        return self.peer is not None

    def need_on(self, gpu: int) -> int:
        return self.need.get(gpu, 0)


@attrs.frozen
class PoolSpec:
    """Several models behind one name, in priority order.

    Without ``fallback`` only the first member serves; with it a request goes to the first member that has a
    free slot and enough context.
    """

    name: str
    members: tuple[str, ...]
    fallback: bool = False


@attrs.frozen
class PeerSpec:
    """Another router (or any OpenAI-compatible server) that serves models here over HTTP.

    Its own queueing happens on the peer; here it is a limit: at most ``max_in_flight`` requests are
    forwarded to it at once, the rest wait in this router's queue like requests for a busy local model.
    """

    name: str
    max_in_flight: int = 4


@attrs.frozen
class DeviceSpec:
    id: int
    budget: int | None = None


@attrs.frozen
class Policy:
    max_models_per_gpu: int = 1
    eviction: str = "lru"
    queue_head_grace: float = 0.0
    queue_force_load_timeout: float = 300.0
    queue_limit: int = 1000
    routing_queue_limit: int = 32
    # Prefix affinity: a free replica up to ``affinity_guard`` requests busier than the least busy one may
    # be preferred because it recently served the longest part of the request's prefix chain. Each replica
    # remembers ``affinity_memory`` chains per slot: one per slot for what its slots hold now, the rest for
    # what llama-server's host-memory prompt cache may still restore; small, so a choice stays cheap.
    affinity_guard: int = 1
    affinity_memory: int = 4
    # The most seconds a request of each class (interactive, standard, batch) waits before it goes ahead of
    # every class, oldest first (see statemachine/classes.py).
    max_wait: tuple[float, float, float] = (30.0, 120.0, 600.0)
    # Swap batching (statemachine/swaps.py): a request that waits for a swap and does not claim its GPUs yet
    # lets at most ``swap_batch_max`` later requests go past it on those GPUs (None: only time bounds it).
    swap_batch_max: int | None = None
    # An idle resident whose last use is this recent is held (not evicted) for a request that does not claim
    # yet: its client may come back. None: a tenth of the load times measured for the two models.
    swap_hold: float | None = 0.0
    # A model ready for less than this many seconds (or still loading) is not evicted, except for a request
    # that has waited its class's maximum wait.
    min_residency: float = 0.0

    @property
    def claim_after(self) -> float:
        """How long a request that needs a swap waits before it holds its GPUs against later requests."""
        return min(self.queue_head_grace, self.queue_force_load_timeout)


def _models(value: Mapping[str, ModelSpec] | list[ModelSpec]) -> PMap[str, ModelSpec]:
    if isinstance(value, Mapping):
        return pmap(value)
    return pmap({m.name: m for m in value})


def _pools(value: Mapping[str, PoolSpec] | list[PoolSpec]) -> PMap[str, PoolSpec]:
    if isinstance(value, Mapping):
        return pmap(value)
    return pmap({p.name: p for p in value})


def _peers(value: Mapping[str, PeerSpec] | list[PeerSpec]) -> PMap[str, PeerSpec]:
    if isinstance(value, Mapping):
        return pmap(value)
    return pmap({p.name: p for p in value})


def _devices(value: Mapping[int, DeviceSpec] | list[DeviceSpec]) -> PMap[int, DeviceSpec]:
    if isinstance(value, Mapping):
        return pmap(value)
    return pmap({d.id: d for d in value})


@attrs.frozen
class Settings:
    models: PMap[str, ModelSpec] = attrs.field(converter=_models)
    pools: PMap[str, PoolSpec] = attrs.field(factory=pmap, converter=_pools)
    devices: PMap[int, DeviceSpec] = attrs.field(factory=pmap, converter=_devices)
    policy: Policy = attrs.field(factory=Policy)
    peers: PMap[str, PeerSpec] = attrs.field(factory=pmap, converter=_peers)
    # Fair share: the weight of each named key (a key not named here, the anonymous "" included, weighs 1).
    weights: PMap[str, int] = attrs.field(factory=pmap, converter=pmap)
    # The most requests each named key may have waiting at once (a key not named here: only queue_limit).
    max_queued: PMap[str, int] = attrs.field(factory=pmap, converter=pmap)
    # Plain-dict views for the scheduler's hot path, derived once (not part of equality or repr).
    model_table: dict[str, ModelSpec] = attrs.field(init=False, eq=False, repr=False)
    pool_table: dict[str, PoolSpec] = attrs.field(init=False, eq=False, repr=False)
    budget_table: dict[int, int | None] = attrs.field(init=False, eq=False, repr=False)
    pools_by_model: dict[str, tuple[str, ...]] = attrs.field(init=False, eq=False, repr=False)
    weight_table: dict[str, int] = attrs.field(init=False, eq=False, repr=False)
    targets: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_model = {
            name: tuple(p.name for p in self.pools.values() if name in p.members) for name in self.models
        }
        derived = {
            "model_table": dict(self.models),
            "pool_table": dict(self.pools),
            "budget_table": {gpu: d.budget for gpu, d in self.devices.items()},
            "pools_by_model": by_model,
            "weight_table": dict(self.weights.items()),
            "targets": (*self.models.keys(), *self.pools.keys()),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def budget(self, gpu: int) -> int | None:
        return self.budget_table.get(gpu)

    def pools_of(self, model: str) -> tuple[str, ...]:
        return self.pools_by_model.get(model, ())

    def weight(self, key: str) -> int:
        return self.weight_table.get(key, 1)

    def peer_limit(self, peer: str) -> int:
        """How many requests may be forwarded to ``peer`` at once (0 for a peer no longer configured)."""
        spec = self.peers.get(peer)
        return 0 if spec is None else spec.max_in_flight
