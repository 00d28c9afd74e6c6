"""``step(state, event) -> (state, commands)``: the scheduler's only entry point.

Each event type has one rule in ``_RULES``. A rule checks the event's precondition (raising IllegalEvent,
which leaves the caller's state as it was), applies its effect to a working copy, and then the scheduling
pass (``passes.schedule``) decides what can move. The same sequence of events always yields the same
commands: there is no clock, no randomness and no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .commands import Command, Kill, KillCause, Reject, RejectCode
from .errors import IllegalEvent
from .events import (
    At,
    ClientGone,
    DispatchFailed,
    Event,
    ForeignMemory,
    LoadFailed,
    LoadRequested,
    PeerFailed,
    PeerState,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    SettingsChanged,
    ShutdownRequested,
    Startup,
    Tick,
    UnloadRequested,
)
from .loads import abandon
from .passes import candidates, dispatch_arrival, fail_waiters, no_peer_answer, schedule
from .placement import spawn_fitting
from .queries import serving_models
from .recovery import dispatch_failed, peer_failed, peer_state
from .state import INFLIGHT, LOADING, QUEUED, READY, STOPPING, Replica, Request, State
from .work import EMPTY_COUNTS, Work


def step(state: State, event: Event) -> tuple[State, tuple[Command, ...]]:
    rule = _RULES.get(type(event))
    if rule is None:
        raise IllegalEvent(f"unknown event type {type(event).__name__}")
    w = Work(state)
    rule(w, event)
    schedule(w)
    return w.freeze(), tuple(w.cmds)


def run(state: State, events: list[Event]) -> tuple[State, list[Command]]:
    """Feed ``events`` in order; return the final state and every command (handy in tests and replays)."""
    out: list[Command] = []
    for event in events:
        state, cmds = step(state, event)
        out.extend(cmds)
    return state, out


# ---------------------------------------------------------------------------------------------- rules
def _tick(w: Work, e: Tick) -> None:
    if e.now < w.now:
        raise IllegalEvent(f"Tick({e.now}) goes back in time (now is {w.now})")
    w.now = e.now
    if w.wake_at is not None and e.now >= w.wake_at:
        w.wake_at = None  # the requested wake-up happened; a later WakeAt for the same time is sent again


def _at(w: Work, e: At) -> None:
    inner = e.event
    if isinstance(inner, Tick | At):
        raise IllegalEvent(f"At({e.now}) wraps a {type(inner).__name__}: send the Tick itself")
    rule = _RULES.get(type(inner))
    if rule is None:
        raise IllegalEvent(f"unknown event type {type(inner).__name__}")
    due = w.wake_at is not None and e.now >= w.wake_at
    _tick(w, Tick(e.now))
    if due or w.waiting or w.wanted or w.shutting_down:
        schedule(w)  # the Tick's own pass: a timer is due, or what waits may be decided otherwise later
    # Else that pass would change nothing: nothing waits, nothing is wanted, and every deadline the last
    # pass saw (idle models' ends) lies at or after wake_at, which the clock has not reached (INV-AT).
    rule(w, inner)


def _startup(w: Work, e: Startup) -> None:
    if w.shutting_down:
        return
    for spec in sorted(w.settings.models.values(), key=lambda m: m.name):
        if not (spec.pinned or spec.load_on_startup) or spec.refusal is not None or spec.remote:
            continue
        live = len(w.live_replicas(spec.name))
        if live and spec.name in w.failing:
            continue
        missing = spec.replicas - live
        if spec.chooses:
            spawn_fitting(w, spec, set(), "load on startup", None)
        elif missing > 0 and all(w.fits(spec, g, missing, set(), count_stopping=True) for g in spec.gpus):
            for _ in range(missing):
                w.spawn(spec, "load on startup", None)


def _arrived(w: Work, e: RequestArrived) -> None:
    admitted = _admit(w, e)
    if admitted is not None:
        request, names = admitted
        if not dispatch_arrival(w, request, names):
            w.enqueue(request)


def _admit(w: Work, e: RequestArrived) -> tuple[Request, list[str]] | None:
    """The arriving request, marked overflow when over a bound, and its candidates; None when it is
    rejected at once."""
    if e.rid in w.requests:
        raise IllegalEvent(f"request {e.rid} arrived twice")
    request = Request(
        rid=e.rid,
        target=e.target,
        tokens=e.tokens,
        arrived=w.now,
        seq=w.next_seq,
        prefix=e.prefix,
        local_only=e.local_only,
        key=e.key,
        klass=e.klass,
        outside=e.outside,
        keep_alive=e.keep_alive,
    )
    w.next_seq += 1
    if w.shutting_down:
        w.cmds.append(Reject(e.rid, RejectCode.SHUTTING_DOWN, "the router is shutting down; retry shortly"))
        return None
    models, pools = w.models, w.settings.pool_table  # (plain tables of the same)
    if e.target not in models and e.target not in pools:
        known = ", ".join(sorted((*models.keys(), *pools.keys())))
        message = f"model '{e.target}' is not served here; known models: {known}"
        w.cmds.append(Reject(e.rid, RejectCode.MODEL_NOT_FOUND, message))
        return None
    names = candidates(w, e.target, e.tokens, local_only=e.local_only, outside=e.outside)
    if not names:
        if candidates(w, e.target, e.tokens, peers=False, outside=e.outside):
            w.cmds.append(Reject(e.rid, *no_peer_answer(w, request)))  # its peers are down, or a second hop
        else:
            w.cmds.append(_unservable(w, e))
        return None
    pool = pools.get(e.target)
    over = w.waiting >= w.policy.queue_limit
    if pool is not None and w.queue(pool.name).count >= w.policy.routing_queue_limit:
        over = True
    code = RejectCode.QUEUE_FULL if over else None
    max_queued = w.settings.max_queued
    own_limit = max_queued.get(e.key) if max_queued else None  # checked after the whole queue's limits
    if code is None and own_limit is not None and w.queued_of(e.key) >= own_limit:
        code = RejectCode.KEY_QUEUE_FULL
    if code is not None:
        request = attrs.evolve(request, overflow=True)
        w.overflow.append((e.rid, code))
    return request, names


def _unservable(w: Work, e: RequestArrived) -> Command:
    specs = [w.model(m) for m in serving_models(w.settings, e.target)]
    if not specs:
        message = f"no member of '{e.target}' is served now (a peer's model joins once its peer answers)"
        return Reject(e.rid, RejectCode.MODEL_UNAVAILABLE, message)
    refused = [s for s in specs if s.refusal is not None]
    if len(refused) == len(specs):
        return Reject(e.rid, RejectCode.MODEL_UNAVAILABLE, "; ".join(s.refusal or "" for s in refused))
    largest = max(s.ctx_per_slot or 0 for s in specs if s.refusal is None)
    return Reject(
        e.rid,
        RejectCode.CONTEXT_LENGTH_EXCEEDED,
        f"the request needs {e.tokens} tokens but the largest per-slot context of '{e.target}' is {largest} "
        "tokens (ctx / parallel); shorten the prompt or max_tokens, or raise the model's ctx",
    )


def _client_gone(w: Work, e: ClientGone) -> None:
    request = w.request(e.rid)
    if request is None:
        raise IllegalEvent(f"ClientGone for unknown request {e.rid}")
    if request.phase == QUEUED:
        w.unqueue(request)
        abandon(w, request)
    else:
        # The shell reports a client gone after it has closed the upstream exchange: the slot is free now.
        w.release(request)


def _finished(w: Work, e: RequestFinished) -> None:
    request = w.request(e.rid)
    if request is None or request.phase != INFLIGHT:
        raise IllegalEvent(f"RequestFinished for request {e.rid}, which is not in flight")
    w.release(request)
    replica = w.replicas.get(request.replica) if request.replica is not None else None
    if e.broken and replica is not None and replica.phase == READY and not replica.draining:
        w.put(attrs.evolve(replica, draining=True))  # it broke a reply: no new work; stopped once idle


def _killed_loading(replica: Replica | None) -> bool:
    """Stopped before it was ever ready (evicted, abandoned, unloaded): a report of its load came late."""
    return replica is not None and replica.phase == STOPPING and replica.ready_at is None


def _ready(w: Work, e: ReplicaReady) -> None:
    replica = w.replicas.get(e.replica)
    if _killed_loading(replica):
        return
    if replica is None or replica.phase != LOADING:
        raise IllegalEvent(f"ReplicaReady for replica {e.replica}, which is not loading")
    w.put(attrs.evolve(replica, phase=READY, ready_at=w.now))
    w.load_seconds[replica.model] = w.now - replica.spawned_at
    w.failing.discard(replica.model)


def _load_failed(w: Work, e: LoadFailed) -> None:
    replica = w.replicas.get(e.replica)
    if _killed_loading(replica):
        return
    if replica is None or replica.phase != LOADING:
        raise IllegalEvent(f"LoadFailed for replica {e.replica}, which is not loading")
    w.put(attrs.evolve(replica, phase=STOPPING))
    w.cmds.append(Kill(replica.id, replica.model, f"load failed: {e.reason}", KillCause.LOAD_FAILED))
    _after_load_failure(w, replica.model, e.reason)


def _after_load_failure(w: Work, model: str, reason: str) -> None:
    if w.live_replicas(model):
        w.failing.add(model)  # the others may still load; no new one starts meanwhile
        return
    w.failing.discard(model)
    fail_waiters(w, model, f"model '{model}' failed to load: {reason}", RejectCode.LOAD_FAILED)


def _unresponsive(w: Work, e: ReplicaUnresponsive) -> None:
    replica = w.replicas.get(e.replica)
    if replica is None or replica.phase == STOPPING:
        return  # already going: the report is moot
    if replica.phase != READY:
        raise IllegalEvent(f"ReplicaUnresponsive for replica {e.replica}, which is still loading")
    w.kill(replica, f"not responding: {e.reason}", KillCause.UNRESPONSIVE)


def _exited(w: Work, e: ReplicaExited) -> None:
    replica = w.replicas.get(e.replica)
    if replica is None:
        raise IllegalEvent(f"ReplicaExited for unknown replica {e.replica}")
    w.drop_replica(replica)
    for rid in sorted(replica.inflight):
        w.requests.remove(rid)
        message = f"the replica of '{replica.model}' serving this request exited: {e.reason}"
        w.cmds.append(Reject(rid, RejectCode.REPLICA_EXITED, message))
    if replica.phase == LOADING:
        _after_load_failure(w, replica.model, e.reason)


def _unload(w: Work, e: UnloadRequested) -> None:
    if e.model is not None and e.model not in w.settings.models:
        raise IllegalEvent(f"UnloadRequested for unknown model {e.model!r}")
    w.wanted = [m for m in w.wanted if e.model not in (None, m)]
    for replica in list(w.replicas.values()):
        if replica.phase == STOPPING or (e.model is not None and replica.model != e.model):
            continue
        if e.force or not replica.inflight:
            reason = "unload requested" + (" (forced)" if replica.inflight else "")
            w.kill(replica, reason, KillCause.UNLOADED)
        else:
            w.put(attrs.evolve(replica, draining=True))


def _load_requested(w: Work, e: LoadRequested) -> None:
    spec = w.models.get(e.model)
    if spec is None:
        raise IllegalEvent(f"LoadRequested for unknown model {e.model!r}")
    if spec.remote or spec.refusal is not None or w.shutting_down or e.model in w.wanted:
        return  # nothing to load here, or asked already
    w.wanted.append(e.model)


def _settings_changed(w: Work, e: SettingsChanged) -> None:
    """A reload: replicas of removed or restarted models retire (drain, stop); the new settings apply."""
    old, new = w.settings, e.settings
    removed = {m for m in old.models if m not in new.models}
    moved = {
        m
        for m in old.models
        if m in new.models
        and (old.models[m].gpus, old.models[m].slots, old.models[m].need, old.models[m].choices)
        != (new.models[m].gpus, new.models[m].slots, new.models[m].need, new.models[m].choices)
    }
    retire = removed | moved | set(e.restart)
    for replica in list(w.replicas.values()):
        if replica.model in retire and replica.id not in w.retired:
            w.retired[replica.id] = w.spec_of(replica)
    w.settings, w.policy, w.models = new, new.policy, new.model_table
    limit = new.policy.swap_batch_max  # counts of overtakes past a new, lower bound claim at once
    w.overtaken = {} if limit is None else {rid: min(n, limit) for rid, n in w.overtaken.items()}
    w.memo.clear()
    w.foreign = EMPTY_COUNTS  # the new budgets were planned with the memory other processes hold now
    for peer in [p for p in w.peers_down if p not in new.peers]:
        del w.peers_down[peer]
    for replica in sorted(w.replicas.values(), key=lambda r: r.id):
        if replica.id not in w.retired or replica.phase == STOPPING:
            continue
        if replica.inflight:
            w.put(attrs.evolve(replica, draining=True))
        else:
            gone = "removed from the configuration" if replica.model in removed else "configuration changed"
            w.kill(replica, gone, KillCause.RELOAD)
    for request in sorted((r for r in w.state.requests.values() if r.phase == QUEUED), key=lambda r: r.seq):
        if request.target not in new.models and request.target not in new.pools:
            message = f"'{request.target}' was removed from the configuration while this request waited"
            w.reject(request, RejectCode.MODEL_NOT_FOUND, message)


def _foreign(w: Work, e: ForeignMemory) -> None:
    if e.bytes < 0:
        raise IllegalEvent(f"ForeignMemory({e.gpu}, {e.bytes}): a negative amount")
    w.foreign = w.foreign.set(e.gpu, e.bytes) if e.bytes else w.foreign.discard(e.gpu)


def _shutdown(w: Work, e: ShutdownRequested) -> None:
    w.deadline = e.deadline if w.deadline is None else min(w.deadline, e.deadline)
    w.shutting_down = True
    for request in sorted((r for r in w.state.requests.values() if r.phase == QUEUED), key=lambda r: r.seq):
        w.reject(request, RejectCode.SHUTTING_DOWN, "the router is shutting down; retry shortly")


_RULES: dict[type, Callable[[Work, Any], None]] = {
    Tick: _tick,
    At: _at,
    Startup: _startup,
    RequestArrived: _arrived,
    ClientGone: _client_gone,
    RequestFinished: _finished,
    ReplicaReady: _ready,
    LoadFailed: _load_failed,
    ReplicaUnresponsive: _unresponsive,
    ReplicaExited: _exited,
    UnloadRequested: _unload,
    LoadRequested: _load_requested,
    DispatchFailed: dispatch_failed,
    PeerFailed: peer_failed,
    PeerState: peer_state,
    SettingsChanged: _settings_changed,
    ForeignMemory: _foreign,
    ShutdownRequested: _shutdown,
}
