"""``check(state)``: every state invariant of spec/scheduler.md (INV-*), raising on the first violation."""

from __future__ import annotations

from .queries import residents, used
from .state import INFLIGHT, QUEUED, READY, STOPPING, State


class InvariantViolation(AssertionError):
    pass


def _fail(inv: str, message: str) -> None:
    raise InvariantViolation(f"{inv}: {message}")


def check(state: State) -> None:
    settings = state.settings
    gpus = {g for r in state.replicas for g in r.gpus}
    for gpu in sorted(gpus):
        models = residents(state, gpu)
        if len(models) > settings.policy.max_models_per_gpu:
            _fail("INV-CAP", f"GPU {gpu} holds {sorted(models)} (cap {settings.policy.max_models_per_gpu})")
        budget = settings.budget(gpu)
        if budget is not None and used(state, gpu) > budget:
            _fail("INV-BUDGET", f"GPU {gpu} uses {used(state, gpu)} bytes of {budget}")
    by_id = {r.id: r for r in state.replicas}
    if len(by_id) != len(state.replicas):
        _fail("INV-IDS", "two replicas share an id")
    for model in state.failing:
        live = [r for r in state.replicas if r.model == model and r.phase != STOPPING and not r.draining]
        if not live:
            _fail("INV-FAILING", f"{model} is marked failing but has no live replica")
    for replica in state.replicas:
        spec = state.spec_of(replica)
        if len(replica.inflight) > spec.slots:
            _fail(
                "INV-SLOTS", f"replica {replica.id} has {len(replica.inflight)} in flight, {spec.slots} slots"
            )
        if replica.inflight and replica.phase not in (READY, STOPPING):
            _fail("INV-READY", f"replica {replica.id} is {replica.phase} with requests in flight")
        if replica.inflight and replica.phase == STOPPING and not replica.forced:
            _fail("INV-KILL-IDLE", f"replica {replica.id} was killed with requests in flight")
        _check_memory(replica.id, replica.memory, settings.policy.affinity_memory * spec.slots)
        if not spec.runs_on(replica.gpus):
            _fail("INV-GPUS", f"replica {replica.id} runs on {replica.gpus}: no GPU set of {spec.name}")
        for rid in replica.inflight:
            request = state.requests.get(rid)
            if request is None or request.phase != INFLIGHT or request.replica != replica.id:
                _fail("INV-REQUEST-HOME", f"replica {replica.id} holds request {rid} that is not its own")
    queued = 0
    by_key: dict[str, int] = {}
    for request in state.requests.values():
        if request.phase == QUEUED:
            queued += 1
            by_key[request.key] = by_key.get(request.key, 0) + 1
            if request.replica is not None:
                _fail("INV-REQUEST-HOME", f"queued request {request.rid} names replica {request.replica}")
        elif request.peer is not None:
            if request.replica is not None or request.rid not in state.peer_inflight.get(request.peer, ()):
                _fail("INV-PEER-HOME", f"request {request.rid} is forwarded to {request.peer}, not counted")
        else:
            replica = by_id.get(request.replica) if request.replica is not None else None
            if replica is None or request.rid not in replica.inflight:
                _fail("INV-REQUEST-HOME", f"request {request.rid} is {request.phase} but no replica holds it")
    if queued != state.waiting:
        _fail("INV-QUEUE", f"{queued} requests are queued but the count says {state.waiting}")
    if by_key != dict(state.queued_by_key):
        _fail(
            "INV-KEY-QUEUE",
            f"requests waiting per key are {by_key}, the counts say {dict(state.queued_by_key)}",
        )
    _check_queues(state, queued)
    limit = settings.policy.swap_batch_max
    for rid, count in state.overtaken.items():
        request = state.requests.get(rid)
        if request is None or request.phase != QUEUED or limit is None or not 0 < count <= limit:
            _fail("INV-SWAP-BATCH", f"request {rid} counts {count} overtakes (swap_batch_max {limit})")
    if state.shutting_down and queued:
        _fail("INV-SHUTDOWN", f"{queued} requests still wait after shutdown began")
    for rid, _spec in state.retired.items():
        replica = by_id.get(rid)
        if replica is None or not (replica.draining or replica.phase == STOPPING):
            _fail("INV-RETIRED", f"retired replica {rid} is gone or still takes work")
    _check_peers(state)
    _check_index(state)


def _check_peers(state: State) -> None:
    """Requests forwarded to each peer are exactly its count; a peer holds no more than its limit; only
    configured peers are down; no request from another router is forwarded again."""
    for peer, rids in state.peer_inflight.items():
        if not rids:
            _fail("INV-PEER-HOME", f"peer {peer} is listed with no request in flight")
        for rid in rids:
            request = state.requests.get(rid)
            if request is None or request.phase != INFLIGHT or request.peer != peer:
                _fail("INV-PEER-HOME", f"peer {peer} counts request {rid}, which is not forwarded to it")
            elif request.local_only:
                _fail("INV-HOP", f"request {rid} came from another router and was forwarded to {peer}")
        limit = state.settings.peer_limit(peer)
        if peer in state.settings.peers and len(rids) > limit:
            _fail("INV-PEER-LIMIT", f"peer {peer} has {len(rids)} requests in flight (max_in_flight {limit})")
    for peer in state.peers_down:
        if peer not in state.settings.peers:
            _fail("INV-PEER-DOWN", f"peer {peer} is marked down but not configured")


def _check_memory(rid: int, memory: tuple[tuple[int, ...], ...], bound: int) -> None:
    """A replica remembers at most ``bound`` chains, none empty, none a prefix of a more recent one."""
    if len(memory) > max(bound, 0):
        _fail("INV-AFFINITY-MEMORY", f"replica {rid} remembers {len(memory)} chains (bound {bound})")
    for i, chain in enumerate(memory):
        if not chain:
            _fail("INV-AFFINITY-MEMORY", f"replica {rid} remembers an empty chain")
        for newer in memory[:i]:
            if newer[: len(chain)] == chain:
                _fail("INV-AFFINITY-MEMORY", f"replica {rid} remembers {chain} beside its extension {newer}")


def _check_index(state: State) -> None:
    """The cache step() carries between states agrees with the replicas it was built from."""
    index = state.index
    if index is None or not index.valid_for(state):
        return
    by_model: dict[str, list[int]] = {}
    for replica in state.replicas:
        by_model.setdefault(replica.model, []).append(replica.id)
    if {m: tuple(ids) for m, ids in by_model.items()} != index.by_model:
        _fail("INV-INDEX", f"replicas by model {index.by_model} should be {by_model}")
    models = state.settings.models
    for model, (free, live) in index.memo.items():
        mine = [r for r in state.replicas if r.model == model]
        slots = models[model].slots
        want_free = any(r.phase == READY and not r.draining and len(r.inflight) < slots for r in mine)
        want_live = sum(1 for r in mine if r.phase != STOPPING and not r.draining)
        if (free, live) != (want_free, want_live):
            _fail("INV-INDEX", f"model {model} cached as {(free, live)}, is {(want_free, want_live)}")


def _check_queues(state: State, queued: int) -> None:
    """INV-QUEUE: every queued request sits in its lane of its target's queue, lanes in arrival order."""
    listed = 0

    def is_queued(rid: int) -> bool:
        return rid in state.requests and state.requests[rid].phase == QUEUED

    for target, queue in state.queues.items():
        in_lanes = 0
        for lane, fifo in queue.lanes.items():
            live = list(fifo.live(is_queued))
            if not live or len(live) != fifo.count:
                _fail("INV-QUEUE", f"queue {target} lane {lane} counts {fifo.count} but holds {len(live)}")
            if fifo.first() != live[0]:
                _fail("INV-QUEUE", f"queue {target} lane {lane} has a dead head")
            for rid in live:
                request = state.requests[rid]
                if request.target != target or request.lane != lane:
                    _fail("INV-QUEUE", f"request {rid} sits in the queue of {target}, lane {lane}")
            seqs = [state.requests[rid].seq for rid in live]
            if seqs != sorted(seqs):
                _fail("INV-QUEUE", f"queue {target} lane {lane} is out of arrival order")
            in_lanes += len(live)
        if not in_lanes or in_lanes != queue.count:
            _fail("INV-QUEUE", f"queue {target} counts {queue.count} but its lanes hold {in_lanes}")
        listed += in_lanes
    if listed != queued:
        _fail("INV-QUEUE", f"{queued} requests are queued but {listed} are in queues")
