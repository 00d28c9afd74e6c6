"""The scheduling pass that runs after every event: dispatch, load, evict, unload idle, shut down.

Waiting requests are considered in arrival order (a merge of the per-target queues). Two sets carry what
earlier requests decided into later ones:

- ``blocked`` GPUs: an earlier request needs a swap there and has waited its grace; later requests for
  models on those GPUs neither dispatch nor load, so they cannot overtake it;
- ``protected`` models: an earlier request waits for a slot of that model; a later request may not evict it.
"""

from __future__ import annotations

import heapq

from .commands import Stopped, WakeAt
from .settings import ModelSpec
from .state import LOADING, STOPPING, Request
from .work import Work


def candidates(w: Work, target: str, tokens: int | None) -> list[str]:
    """Models that may serve a request for ``target``, in priority order (context and refusal checked)."""
    pool = w.settings.pools.get(target)
    if pool is None:
        names: tuple[str, ...] = (target,)
    elif pool.fallback:
        names = pool.members
    else:
        names = pool.members[:1]
    out = []
    for name in names:
        spec = w.model(name)
        if spec.refusal is not None:
            continue
        if tokens is not None and spec.ctx_per_slot is not None and tokens > spec.ctx_per_slot:
            continue
        out.append(name)
    return out


def schedule(w: Work) -> None:
    if w.shutting_down:
        _shutdown_progress(w)
        return
    wake: list[float] = []
    blocked: set[int] = set()
    protected: set[str] = set()
    heap: list[tuple[int, str]] = []
    for target in (*w.settings.models.keys(), *w.settings.pools.keys()):
        head = w.fifo(target).first()
        if head is not None:
            heap.append((w.requests[head].seq, target))
    heapq.heapify(heap)
    while heap:
        _, target = heapq.heappop(heap)
        head = w.fifo(target).first()
        assert head is not None
        _place(w, w.requests[head], blocked, protected, wake)
        if not w.is_queued(head):
            nxt = w.fifo(target).first()
            if nxt is not None:
                heapq.heappush(heap, (w.requests[nxt].seq, target))
    for rid in w.overflow:
        request = w.request(rid)
        if request is not None and request.phase == "queued":
            w.reject(request, 503, "queue_full", _overflow_message(w, request))
    w.overflow.clear()
    _reap_drained(w)
    _expire_idle(w, wake)
    _set_wake(w, wake)


def _overflow_message(w: Work, request: Request) -> str:
    pool = w.settings.pools.get(request.target)
    limit = w.policy.queue_limit
    if pool is not None and w.fifo(pool.name).count > w.policy.routing_queue_limit:
        limit = w.policy.routing_queue_limit
        return (
            f"every member of pool '{pool.name}' is busy and its waiting queue is full "
            f"(routing_queue_limit = {limit}); retry later"
        )
    return f"the queue is full ({w.waiting - 1} requests waiting, queue_limit = {limit}); retry later"


def _place(w: Work, request: Request, blocked: set[int], protected: set[str], wake: list[float]) -> None:
    """Dispatch ``request`` if it can go now; otherwise start what it waits for (a load, a swap)."""
    names = candidates(w, request.target, request.tokens)
    for name in names:
        spec = w.model(name)
        if blocked.intersection(spec.gpus):
            continue
        replica = w.free_replica(name)
        if replica is not None:
            w.dispatch(request, replica, name)
            return
    if request.overflow:
        return
    to_load: ModelSpec | None = None
    for name in names:
        spec = w.model(name)
        if len(w.live_replicas(name)) < spec.replicas:
            to_load = spec
            break
        protected.add(name)
    if to_load is None:
        return
    claiming = w.now - request.arrived >= w.policy.claim_after
    if not claiming:
        wake.append(request.arrived + w.policy.claim_after)
    gpus = set(to_load.gpus)
    if blocked & gpus:
        if claiming:
            blocked |= gpus
        return
    missing = to_load.replicas - len(w.live_replicas(to_load.name))
    if all(w.fits(to_load, g, missing, set(), count_stopping=True) for g in to_load.gpus):
        for _ in range(missing):
            w.spawn(to_load, f"request {request.rid} for '{request.target}'")
        protected.add(to_load.name)
        return
    victims = _victims(w, to_load, missing, protected)
    if victims is None and _victims(w, to_load, missing, set()) is None:
        _refuse_everywhere(w, to_load)
        return
    if claiming:
        blocked |= gpus
    if not victims:
        return
    busy = [v for v in victims if w.has_queued(v) or any(r.inflight for r in w.replicas_of(v))]
    if claiming or not busy:
        where = ", ".join(str(g) for g in to_load.gpus)
        for victim in victims:
            for replica in w.replicas_of(victim):
                if not replica.inflight:
                    w.kill(replica, f"evicted ({w.policy.eviction}) to load '{to_load.name}' on GPU {where}")
    return


def _victims(w: Work, spec: ModelSpec, missing: int, protected: set[str]) -> list[str] | None:
    """Models to evict so that ``missing`` replicas of ``spec`` fit; None when it cannot be done now."""
    victims: list[str] = []
    gone = {r.model for r in w.replicas.values() if r.phase == STOPPING} - {
        r.model for r in w.replicas.values() if r.phase != STOPPING
    }
    for gpu in spec.gpus:
        while not w.fits(spec, gpu, missing, gone | set(victims), count_stopping=False):
            choices = {
                r.model
                for r in w.replicas.values()
                if gpu in r.gpus and r.phase != STOPPING and r.model != spec.name
            } - set(victims)
            choices = {m for m in choices if not w.model(m).pinned and m not in protected}
            if not choices:
                return None
            victims.append(min(choices, key=lambda m: _victim_key(w, m)))
    return victims


def _victim_key(w: Work, model: str) -> tuple[bool, float, str]:
    if w.policy.eviction == "fifo":
        age = w.loaded_at[model] if model in w.loaded_at else w.now  # noqa: SIM401 (evolver)
    else:
        age = w.last_use(model)
    return (w.has_queued(model), age, model)


def _refuse_everywhere(w: Work, spec: ModelSpec) -> None:
    """``spec`` cannot be loaded even with every evictable model gone: refuse what waits only for it."""
    pinned = sorted(
        {r.model for r in w.replicas.values() if set(r.gpus) & set(spec.gpus) and w.model(r.model).pinned}
    )
    reason = f"model '{spec.name}' cannot be loaded on GPU {', '.join(map(str, spec.gpus))}"
    if pinned:
        reason += f": pinned model(s) {', '.join(pinned)} hold it (max_models_per_gpu = "
        reason += f"{w.policy.max_models_per_gpu}); unpin them or give '{spec.name}' other GPUs"
    else:
        reason += ": its memory need exceeds the GPU budget; choose a smaller quant or context"
    fail_waiters(w, spec.name, reason, 503, "model_unavailable")


def fail_waiters(w: Work, model: str, reason: str, status: int, code: str) -> None:
    """Reject every queued request that only ``model`` could serve."""
    targets = [model, *w.settings.pools_of(model)]
    for target in targets:
        doomed = []
        for rid in w.fifo(target).live(w.is_queued):
            request = w.requests[rid]
            names = candidates(w, target, request.tokens)
            if names == [model] or (target == model):
                doomed.append(request)
        for request in doomed:
            w.reject(request, status, code, reason)


def _reap_drained(w: Work) -> None:
    for replica in list(w.replicas.values()):
        if replica.draining and replica.phase != STOPPING and not replica.inflight:
            w.kill(replica, "unloaded")


def _expire_idle(w: Work, wake: list[float]) -> None:
    for spec in w.settings.models.values():
        if spec.ttl is None or spec.pinned:
            continue
        replicas = [r for r in w.replicas_of(spec.name) if r.phase != STOPPING]
        if not replicas or any(r.inflight or r.phase == LOADING for r in replicas) or w.has_queued(spec.name):
            continue
        due = w.last_use(spec.name) + spec.ttl
        if due <= w.now:
            for replica in replicas:
                w.kill(replica, f"idle for {spec.ttl:g} s (ttl)")
        else:
            wake.append(due)


def _shutdown_progress(w: Work) -> None:
    due = w.deadline is not None and w.now >= w.deadline
    for replica in list(w.replicas.values()):
        if replica.phase == STOPPING:
            continue
        if not replica.inflight:
            w.kill(replica, "router shutting down")
        elif due:
            w.kill(replica, "router shutdown deadline reached")
    if not w.replicas and not w.stopped:
        w.stopped = True
        w.cmds.append(Stopped())
    _set_wake(w, [w.deadline] if w.deadline is not None and not due else [])


def _set_wake(w: Work, wake: list[float]) -> None:
    at = min(wake) if wake else None
    if at is not None and at != w.wake_at:
        w.cmds.append(WakeAt(at))
    w.wake_at = at
