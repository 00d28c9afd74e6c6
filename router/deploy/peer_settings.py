"""The scheduler's settings with the peers' models in them: what ``[peers.NAME]`` lists or discovery found.

A peer model is a ``ModelSpec`` with ``peer`` set and no GPUs: it is never loaded here. A name served here
already keeps its owner: a local model or pool, then a peer that lists it, then the first peer that
discovered it. Pools are rebuilt from the
configuration with the members that exist now, so a pool whose peer member is not known yet (its peer has
not been reached) serves with its local members meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from router.config.values import Config
from statemachine import ModelSpec, PeerSpec, PoolSpec, Settings

DEFAULT_MAX_IN_FLIGHT = 4


@attrs.frozen
class PeerModels:
    """What is known of one peer's models: their names (with their aliases and per-slot context where the
    peer says), and the capacity it advertises (None: unknown)."""

    names: tuple[str, ...] = ()
    aliases: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    ctx_per_slot: Mapping[str, int] = attrs.field(factory=dict)
    capacity: int | None = None


def peer_models(config: Config, found: Mapping[str, PeerModels]) -> dict[str, str]:
    """Model name → the peer that serves it: the peers that list it in the configuration first, then those
    that discovered it, each in the file's order (so a discovery never takes a listed model away)."""
    owner: dict[str, str] = {}
    listed = [(p.name, p.models) for p in config.peers.values() if p.models]
    discovered = [
        (p.name, found.get(p.name, PeerModels()).names) for p in config.peers.values() if not p.models
    ]
    for peer, names in (*listed, *discovered):
        for name in names:
            if name not in config.models and name not in config.pools and name not in owner:
                owner[name] = peer
    return owner


def with_peers(config: Config, local: Settings, found: Mapping[str, PeerModels]) -> Settings:
    """``local`` (the deployment's settings) with every peer model, every peer's in-flight limit, and the
    configured pools over the members known now."""
    owner = peer_models(config, found)
    models = dict(local.models)
    for name, peer in owner.items():
        ctx = found.get(peer, PeerModels()).ctx_per_slot.get(name)
        models[name] = ModelSpec(name, gpus=(), peer=peer, ctx_per_slot=ctx)
    pools = [
        PoolSpec(p.name, tuple(m for m in p.members if m in models), p.fallback)
        for p in config.pools.values()
    ]
    peers = [
        PeerSpec(p.name, max_in_flight_of(p.max_in_flight, found.get(p.name))) for p in config.peers.values()
    ]
    return attrs.evolve(local, models=models, pools=pools, peers=peers)


def max_in_flight_of(configured: int | None, known: PeerModels | None) -> int:
    if configured is not None:
        return configured
    if known is not None and known.capacity:
        return known.capacity
    return DEFAULT_MAX_IN_FLIGHT
