"""Hypothesis strategies for scheduler settings: small clusters where models collide on GPUs."""

from __future__ import annotations

import attrs
from hypothesis import strategies as st

from statemachine import DeviceSpec, ModelSpec, Policy, PoolSpec, Settings

UNKNOWN_TARGET = "ghost"
CTX_CHOICES = (None, 64, 256, 1024)
TOKEN_CHOICES = (None, 1, 50, 200, 500, 2000)
# Prefix chains over a two-letter alphabet, at most three blocks long: requests share leading blocks often.
PREFIXES = st.lists(st.sampled_from((1, 2)), max_size=3).map(tuple)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    return Policy(
        max_models_per_gpu=draw(st.sampled_from((1, 1, 1, 2, 3))),
        eviction=draw(st.sampled_from(("lru", "fifo"))),
        queue_head_grace=draw(st.sampled_from((0.0, 0.0, 0.5, 3.0))),
        queue_force_load_timeout=draw(st.sampled_from((300.0, 300.0, 1.0))),
        queue_limit=draw(st.sampled_from((1000, 1000, 5, 2, 1, 0))),
        routing_queue_limit=draw(st.sampled_from((32, 3, 1, 0))),
    )


@st.composite
def affinity_settings(draw: st.DrawFn) -> Settings:
    """``scheduler_settings`` with an affinity guard of 0–2, a memory of 0, 1 or 4 chains per slot, and two
    replicas for most models (affinity only chooses between replicas)."""
    settings = draw(scheduler_settings())
    guard = draw(st.sampled_from((1, 1, 0, 2)))
    memory = draw(st.sampled_from((4, 4, 1, 0)))
    policy = attrs.evolve(settings.policy, affinity_guard=guard, affinity_memory=memory)
    specs = [attrs.evolve(m, replicas=draw(st.sampled_from((2, 2, 1)))) for m in settings.models.values()]
    return attrs.evolve(settings, models=specs, policy=policy)


@st.composite
def replica_choice_settings(draw: st.DrawFn) -> Settings:
    """One model with three replicas of two or three slots, loaded at startup, and a guard of 0 or 1: every
    arrival is a choice between replicas, the situations the affinity rules are about."""
    spec = ModelSpec("m0", gpus=(0,), replicas=3, slots=draw(st.integers(2, 3)), load_on_startup=True)
    policy = Policy(
        affinity_guard=draw(st.sampled_from((0, 1))), affinity_memory=draw(st.sampled_from((1, 4)))
    )
    return Settings(models=[spec], devices=[DeviceSpec(0, None)], policy=policy)


@st.composite
def models(draw: st.DrawFn, index: int, gpus: list[int]) -> ModelSpec:
    # Now and then a model without GPUs (gpus = [] in the config: it runs on the CPU, outside every cap).
    cpu_only = draw(st.integers(0, 7)) == 0
    some = st.sets(st.sampled_from(gpus), min_size=1, max_size=min(2, len(gpus)))
    chosen = set() if cpu_only else draw(some)
    placed = tuple(sorted(chosen))
    need = {}
    for gpu in placed:
        if draw(st.booleans()):  # otherwise the need on this GPU is unknown
            need[gpu] = draw(st.sampled_from((20, 40, 60, 90)))
    return ModelSpec(
        name=f"m{index}",
        gpus=placed,
        replicas=draw(st.integers(1, 2)),
        slots=draw(st.integers(1, 3)),
        ctx_per_slot=draw(st.sampled_from(CTX_CHOICES)),
        need=need,
        pinned=draw(st.integers(0, 5)) == 0,
        ttl=draw(st.sampled_from((None, None, 2.0, 10.0))),
        load_on_startup=draw(st.integers(0, 4)) == 0,
        refusal="placement: does not fit its GPUs" if draw(st.integers(0, 9)) == 0 else None,
    )


@st.composite
def scheduler_settings(draw: st.DrawFn) -> Settings:
    """1–4 GPUs (some with budgets), 1–5 models on overlapping GPU sets, 0–2 pools, a random policy."""
    gpu_count = draw(st.sampled_from((1, 1, 2, 2, 3, 4)))
    gpus = list(range(gpu_count))
    devices = [DeviceSpec(g, draw(st.sampled_from((None, 100, 150, 200)))) for g in gpus]
    model_specs = [draw(models(i, gpus)) for i in range(draw(st.integers(1, 5)))]
    names = [m.name for m in model_specs]
    pools = []
    for i in range(draw(st.integers(0, 2))):
        members = draw(st.lists(st.sampled_from(names), min_size=min(2, len(names)), max_size=3, unique=True))
        pools.append(PoolSpec(f"p{i}", tuple(members), fallback=draw(st.booleans())))
    return Settings(models=model_specs, pools=pools, devices=devices, policy=draw(policies()))


@st.composite
def claim_settings(draw: st.DrawFn) -> Settings:
    """Two GPUs, one model resident on each at a time: two models take turns on GPU 0, one on GPU 1 and one
    spans both, with a short grace. Requests wait for swaps, claim GPUs and queue behind each other's claims:
    the situations the queue's claim rules are about."""
    placement = {"m0": (0,), "m1": (0,), "m2": (0, 1), "m3": (1,)}
    model_specs = [
        ModelSpec(name, gpus=gpus, replicas=1, slots=draw(st.integers(1, 2)))
        for name, gpus in placement.items()
    ]
    policy = Policy(
        max_models_per_gpu=1,
        eviction=draw(st.sampled_from(("lru", "fifo"))),
        queue_head_grace=draw(st.sampled_from((0.5, 2.0))),
    )
    return Settings(models=model_specs, devices=[DeviceSpec(0, None), DeviceSpec(1, None)], policy=policy)
