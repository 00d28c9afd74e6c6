"""Questions the shell and its pages ask of a state, answered once: pure functions that change nothing."""

from __future__ import annotations

import enum

from .settings import Settings
from .state import LOADING, QUEUED, READY, STOPPING, Replica, Request, State


class ModelState(enum.StrEnum):
    """A model as /v1/models and /status show it: its most advanced replica's phase, or unloaded."""

    READY = "ready"
    LOADING = "loading"
    STOPPING = "stopping"
    UNLOADED = "unloaded"


def serving_models(settings: Settings, target: str) -> tuple[str, ...]:
    """The models that may serve a request for ``target``, in priority order: a model serves itself; a pool
    is served by its members with ``fallback``, by its first member without."""
    pool = settings.pool_table.get(target)
    if pool is None:
        return (target,)
    return pool.members if pool.fallback else pool.members[:1]


def model_state(state: State, model: str) -> ModelState:
    phases = {r.phase for r in state.replicas if r.model == model}
    if READY in phases:
        return ModelState.READY
    if LOADING in phases:
        return ModelState.LOADING
    if STOPPING in phases:
        return ModelState.STOPPING
    return ModelState.UNLOADED


def replica_state(replica: Replica) -> str:
    """A replica's phase as pages and metrics show it: a ready replica that takes no new work is draining."""
    return "draining" if replica.draining and replica.phase == READY else str(replica.phase)


def ready_replicas(state: State, models: tuple[str, ...] | list[str]) -> list[Replica]:
    """Ready replicas of ``models``, the first model's first."""
    return [r for model in models for r in state.replicas if r.model == model and r.phase == READY]


def queue_position(state: State, rid: int) -> int | None:
    """1-based position of request ``rid`` among all waiting requests (arrival order); None unless queued."""
    request = state.requests.get(rid)
    if request is None or request.phase != QUEUED:
        return None
    return 1 + sum(1 for r in state.requests.values() if r.phase == QUEUED and r.seq < request.seq)


def loading_for(state: State, rid: int) -> list[Replica]:
    """Replicas now loading of a model that may serve queued request ``rid`` (a pool's members all count:
    whichever finishes first may take it)."""
    request = state.requests.get(rid)
    if request is None or request.phase != QUEUED:
        return []
    pool = state.settings.pool_table.get(request.target)
    models = set(pool.members) if pool is not None else {request.target}
    return [r for r in state.replicas if r.phase == LOADING and r.model in models]


def find_replica(state: State, replica_id: int) -> Replica | None:
    for r in state.replicas:
        if r.id == replica_id:
            return r
    return None


def replicas_of(state: State, model: str) -> list[Replica]:
    return [r for r in state.replicas if r.model == model]


def residents(state: State, gpu: int) -> set[str]:
    """Models resident on ``gpu``: any replica, from Spawn until it has exited."""
    return {r.model for r in state.replicas if gpu in r.gpus}


def used(state: State, gpu: int) -> int:
    """The predicted bytes of ``gpu`` its replicas hold, each counted with the spec it runs with."""
    return sum(state.spec_of(r).need_for(r.gpus, gpu) for r in state.replicas if gpu in r.gpus)


def queued(state: State) -> list[Request]:
    """Waiting requests in arrival order."""
    return sorted((r for r in state.requests.values() if r.phase == QUEUED), key=lambda r: r.seq)
