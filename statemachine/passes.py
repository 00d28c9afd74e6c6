"""The scheduling pass that runs after every event: dispatch, load, evict, unload idle, shut down.

Waiting requests are considered in rank order (``statemachine.order``: aged first, then class, fair share,
arrival), a merge of the heads of the targets' lanes. Two sets carry what earlier-ranked requests decided
into later ones:

- ``blocked`` GPUs: an earlier request needs a swap there and claims it (interactive at once, others after
  the head grace or their class's maximum wait); later requests for models on those GPUs neither dispatch
  nor load, so they cannot overtake it;
- ``protected`` models: an earlier request waits for a slot of that model (any of its candidates); a later
  request may not evict it.
"""

from __future__ import annotations

import heapq
import math

from .commands import Eviction, KillCause, RejectCode, Stopped, WakeAt
from .loads import load_wanted
from .order import Rank, claim_time
from .placement import placed_load, spawn_fitting
from .queries import serving_models
from .room import choose_victims
from .settings import ModelSpec
from .state import LOADING, STOPPING, Replica, Request
from .swaps import Batches, batch_full, hold_until
from .work import Work


def candidates(
    w: Work,
    target: str,
    tokens: int | None,
    avoid: frozenset[str] = frozenset(),
    local_only: bool = False,
    *,
    peers: bool = True,
    outside: frozenset[str] = frozenset(),
) -> list[str]:
    """Models that may serve a request for ``target``, in priority order (context and refusal checked).

    Models ``outside`` the scope of the request's key are left out, always. Peer models are left out while
    their peer is down, when the request came from another router (``local_only``), and when their peer
    failed this very request before (``avoid``); ``peers=False`` keeps them all (what the request could ask
    for, whatever the peers' state)."""
    models = w.models
    out = []
    for name in serving_models(w.settings, target):
        spec = models[name]
        if spec.refusal is not None or name in outside:
            continue
        if peers and spec.peer is not None and (local_only or name in avoid or spec.peer in w.peers_down):
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
    batches = Batches(w)
    # (rank, target, dispatches before it was ranked, request): ranks are unique (they end in seq). A rank
    # only grows while its request waits (statemachine.order): one ranked before a dispatch is checked again.
    heap: list[tuple[Rank, str, int, Request]] = []
    fair = w.fair
    for target in w.settings.targets:
        head = w.best_head(target)
        if head is not None:
            heap.append((head[0], target, fair.served, head[1]))
    heapq.heapify(heap)
    while heap:
        taken, target, ranked_at, request = heapq.heappop(heap)
        if ranked_at != fair.served:  # a dispatch since may have moved its key's tag on: rank it again
            best = w.best_head(target)
            if best is not None and best[0] > taken:
                heapq.heappush(heap, (best[0], target, fair.served, best[1]))
                continue
        _place(w, request, blocked, protected, wake, batches)
        if w.is_queued(request.rid):
            continue  # it waits: so does the rest of its target
        nxt = w.best_head(target)
        if nxt is not None:
            heapq.heappush(heap, (nxt[0], target, fair.served, nxt[1]))
    load_wanted(w, batches.reserved, protected, wake)  # (every GPU held by a claim is reserved too)
    for rid, code in w.overflow:
        request = w.request(rid)
        if request is not None and request.phase == "queued":
            w.reject(request, code, _overflow_message(w, request, code))
    w.overflow.clear()
    _reap_drained(w)
    _expire_idle(w, wake)
    _set_wake(w, wake)


def _overflow_message(w: Work, request: Request, code: RejectCode) -> str:
    if code is RejectCode.KEY_QUEUE_FULL:
        limit = w.settings.max_queued[request.key]
        return (
            f"the key '{request.key}' has {limit} requests waiting already (its max_queued = {limit}); "
            "retry when one has been served, or raise max_queued in its [keys] table"
        )
    pool = w.settings.pools.get(request.target)
    limit = w.policy.queue_limit
    if pool is not None and w.queue(pool.name).count > w.policy.routing_queue_limit:
        limit = w.policy.routing_queue_limit
        return (
            f"every member of pool '{pool.name}' is busy and its waiting queue is full "
            f"(routing_queue_limit = {limit}); retry later"
        )
    return f"the queue is full ({w.waiting - 1} requests waiting, queue_limit = {limit}); retry later"


def _place(
    w: Work, request: Request, blocked: set[int], protected: set[str], wake: list[float], batches: Batches
) -> None:
    """Dispatch ``request`` if it can go now; otherwise start what it waits for (a load, a swap)."""
    names = candidates(
        w, request.target, request.tokens, request.avoid, request.local_only, outside=request.outside
    )
    if names and _all_busy(w, names):
        # Every candidate has all its replicas and none has a free slot: the request just waits.
        if not request.overflow:
            protected.update(names)
        return
    found = _goes_to(w, names, request.prefix, blocked)
    if found is not None:
        name, replica = found
        if replica is None:
            w.forward(request, w.model(name).peer or "", name)
        else:
            w.dispatch(request, replica, name)
            batches.passed(replica.gpus, blocked)
        return
    if request.overflow:
        return
    protected.update(names)
    load = _to_load(w, names, blocked, protected, request)
    if load is None:
        # A peer model at its in-flight limit frees up by itself: the request waits for it.
        if not any(w.live_replicas(name) or w.model(name).remote for name in names):
            if names:
                w.reject(request, RejectCode.MODEL_UNAVAILABLE, _unloadable_reason(w, w.model(names[0])))
            else:
                w.reject(request, *no_peer_answer(w, request))
        return
    to_load, count = load
    due = claim_time(w.policy, request)
    claiming = w.now >= due or batch_full(w, request)
    gpus = set(to_load.gpus)
    if not (blocked & gpus) and all(w.fits(to_load, g, count, set(), count_stopping=True) for g in gpus):
        spawn_fitting(
            w, w.model(to_load.name), blocked, f"request {request.rid} for '{request.target}'", request.rid
        )
        return
    batches.reserved.update(gpus)
    if not claiming:
        wake.append(due)
        batches.waits(request, to_load.gpus)
    if blocked & gpus:
        if claiming:
            blocked |= gpus
        return
    victims = choose_victims(w, request, to_load, count, protected, wake)
    if claiming:
        blocked |= gpus
    if not victims:
        return
    busy = [v for v in victims if w.has_queued(v) or any(r.inflight for r in w.replicas_of(v))]
    held = None if claiming or busy else hold_until(w, victims, to_load)
    if held is not None:
        wake.append(held)  # its client may come back: no eviction before the hold ends
    elif claiming or not busy:
        where = ", ".join(str(g) for g in to_load.gpus)
        reason = f"evicted ({w.policy.eviction}) to load '{to_load.name}' on GPU {where}"
        eviction = Eviction(to_load.name, to_load.gpus, w.policy.eviction)
        for victim in victims:
            for replica in w.replicas_of(victim):
                if not replica.inflight:
                    w.kill(replica, reason, KillCause.EVICTED, eviction)


def _goes_to(
    w: Work, names: list[str], prefix: tuple[int, ...], blocked: set[int]
) -> tuple[str, Replica | None] | None:
    """Where a request with candidates ``names`` goes now: the first candidate with room, as (model, its
    free replica), or (model, None) for a peer model whose peer takes it; None when none has room."""
    for name in names:
        peer = w.model(name).peer
        if peer is not None:
            if w.peer_free(peer):
                return name, None
            continue
        replica = w.free_replica(name, prefix, blocked)
        if replica is not None:
            return name, replica
    return None


def dispatch_arrival(w: Work, request: Request, names: list[str]) -> bool:
    """Dispatch a request that arrives while nothing waits when a replica of its candidates has a free slot
    (INV-ARRIVE-AT-ONCE): the pass would take it first and send it there, and the step skips its queue."""
    if w.waiting or request.overflow or (names and _all_busy(w, names)):
        return False
    found = _goes_to(w, names, request.prefix, set())
    if found is None or found[1] is None:
        return False  # (a peer's: forwarded by the pass)
    w.dispatch_at_once(request, found[1], found[0])
    return True


def _all_busy(w: Work, names: list[str]) -> bool:
    for name in names:
        peer = w.model(name).peer
        if peer is not None:
            if w.peer_free(peer):
                return False
            continue
        free, live = w.status(name)
        if free or live < w.model(name).replicas:
            return False
    return True


def _to_load(
    w: Work, names: list[str], blocked: set[int], protected: set[str], request: Request
) -> tuple[ModelSpec, int] | None:
    """The first candidate that lacks replicas and could ever get one, bound to the GPUs it loads on, with
    how many more it can have there. A model whose last load failed while others of it still load or serve
    gets none until that settles."""
    for name in names:
        spec = w.model(name)
        if spec.remote:
            continue  # it runs on its peer, never here
        live = len(w.live_replicas(name))
        if live >= spec.replicas or (live and name in w.failing):
            continue
        load = placed_load(w, spec, live, blocked, protected, request)
        if load is not None:
            return load
    return None


def unavailable_reason(w: Work, target: str) -> str:
    """Why no model can serve ``target`` now: the peers of its peer models are down, or none is left."""
    down = []
    for name in serving_models(w.settings, target):
        spec = w.models.get(name)
        if spec is not None and spec.peer is not None and spec.peer in w.peers_down:
            down.append(f"peer '{spec.peer}' serving '{name}' is down ({w.peers_down[spec.peer]})")
    if down:
        return "; ".join(down) + "; retry once it is back, or ask for a model served here"
    return "no model can serve this request"


def no_peer_answer(w: Work, request: Request) -> tuple[RejectCode, str]:
    """The answer to a request no candidate is left for because of peers: one that came from another router
    and may not be forwarded again (loop detected), or one whose peers all failed it or are down."""
    names = serving_models(w.settings, request.target)
    remote = [n for n in names if n in w.models and w.models[n].peer is not None]
    if request.local_only and remote:
        return (
            RejectCode.LOOP_DETECTED,
            f"'{request.target}' is served by another router here, and this request was forwarded by a "
            "router already; it is not forwarded a second time, so that two routers that peer with each "
            "other cannot pass it back and forth. Send it to the router that serves the model itself",
        )
    if any(n in request.avoid for n in remote):
        failed = ", ".join(f"'{n}'" for n in remote if n in request.avoid)
        return RejectCode.PEER_FAILED, f"the peer serving {failed} failed this request; retry later"
    return RejectCode.MODEL_UNAVAILABLE, unavailable_reason(w, request.target)


def _unloadable_reason(w: Work, spec: ModelSpec | None) -> str:
    """Why ``spec`` can never get a replica: pinned models fill its GPUs, or it needs more than they hold."""
    if spec is None:
        return "no model can serve this request"
    if spec.chooses:
        sets = "; ".join(",".join(map(str, c.gpus)) for c in spec.choices)
        return (
            f"model '{spec.name}' cannot be loaded on any GPU set it may use ({sets}): pinned models hold "
            "them or its memory need exceeds what their budgets leave beside pinned models; unpin a model, "
            "or choose a smaller quant or context"
        )
    where = ", ".join(map(str, spec.gpus))
    for gpu in spec.gpus:
        pinned = sorted(
            {
                r.model
                for r in w.replicas.values()
                if gpu in r.gpus and r.model != spec.name and r.phase != STOPPING and w.is_pinned(r.model)
            }
        )
        if len(pinned) + 1 > w.policy.max_models_per_gpu:
            return (
                f"model '{spec.name}' cannot be loaded on GPU {where}: pinned model(s) {', '.join(pinned)} "
                f"hold GPU {gpu} (max_models_per_gpu = {w.policy.max_models_per_gpu}); unpin them or give "
                f"'{spec.name}' other GPUs"
            )
    return (
        f"model '{spec.name}' cannot be loaded on GPU {where}: its memory need exceeds what the GPU budget "
        "leaves beside pinned models; choose a smaller quant or context"
    )


def fail_waiters(w: Work, model: str, reason: str, code: RejectCode) -> None:
    """Reject, in arrival order, every queued request that only ``model`` could serve."""
    doomed: list[Request] = []
    for target in (model, *w.settings.pools_of(model)):
        for rid in w.queue(target).live(w.is_queued):
            request = w.requests[rid]
            if target == model or candidates(w, target, request.tokens, outside=request.outside) == [model]:
                doomed.append(request)
    for request in sorted(doomed, key=lambda r: r.seq):
        w.reject(request, code, reason)


def _reap_drained(w: Work) -> None:
    for replica in list(w.replicas.values()):
        if replica.draining and replica.phase != STOPPING and not replica.inflight:
            w.kill(replica, "unloaded", KillCause.DRAINED)


def _expire_idle(w: Work, wake: list[float]) -> None:
    keep_alive = w.keep_alive
    for spec in w.models.values():  # (the plain table: the same models in the same order)
        ttl = keep_alive[spec.name] if spec.name in keep_alive else spec.ttl  # noqa: SIM401 (evolver)
        if ttl is None or ttl == math.inf or spec.pinned:
            continue
        replicas = [r for r in w.replicas_of(spec.name) if r.phase != STOPPING]
        if not replicas or any(r.inflight or r.phase == LOADING for r in replicas) or w.has_queued(spec.name):
            continue
        due = _idle_since(w, spec.name) + ttl
        if due <= w.now:
            why = "ttl" if ttl == spec.ttl else "keep_alive"
            for replica in replicas:
                w.kill(replica, f"idle for {ttl:g} s ({why})", KillCause.IDLE_TTL)
        else:
            wake.append(due)


def _idle_since(w: Work, model: str) -> float:
    """The later of the model's last use and the spawn that began its current residency."""
    since = w.loaded_at[model] if model in w.loaded_at else w.now  # noqa: SIM401 (evolver)
    if model in w.last_used:
        since = max(since, w.last_used[model])
    return since


def _shutdown_progress(w: Work) -> None:
    due = w.deadline is not None and w.now >= w.deadline
    for replica in list(w.replicas.values()):
        if replica.phase == STOPPING:
            continue
        if not replica.inflight:
            w.kill(replica, "router shutting down", KillCause.SHUTDOWN)
        elif due:
            w.kill(replica, "router shutdown deadline reached", KillCause.DEADLINE)
    if due:
        for peer in sorted(w.peer_inflight.keys()):
            for rid in sorted(w.peer_inflight[peer]):
                w.reject(w.requests[rid], RejectCode.SHUTTING_DOWN, "router shutdown deadline reached")
    if not w.replicas and not w.peer_inflight and not w.stopped:
        w.stopped = True
        w.cmds.append(Stopped())
    _set_wake(w, [w.deadline] if w.deadline is not None and not due else [])


def _set_wake(w: Work, wake: list[float]) -> None:
    at = min(wake) if wake else None
    if at is not None and at != w.wake_at:
        w.cmds.append(WakeAt(at))
    w.wake_at = at
