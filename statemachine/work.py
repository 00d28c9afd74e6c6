"""A working copy of the state for one ``step()``: primitive changes that also record their commands.

``step()`` never mutates its input: it builds a ``Work`` over the old state, applies the event's rule and the
scheduling pass to it, then freezes it into the next ``State``.
"""

from __future__ import annotations

from typing import TypeVar

import attrs
from pyrsistent import pmap, pset
from pyrsistent.typing import PMap, PSet

from .affinity import Chain, remember, shared
from .commands import Command, Dispatch, Eviction, Forward, Kill, KillCause, Reject, RejectCode, Spawn
from .heads import HeadIndex
from .lanes import EMPTY_QUEUE, Lane, TargetQueue
from .order import FairShare, Rank, rank
from .settings import ModelSpec
from .state import (
    INFLIGHT,
    LOADING,
    QUEUED,
    READY,
    STOPPING,
    Replica,
    ReplicaIndex,
    Request,
    State,
)

EMPTY_COUNTS: PMap[int, int] = pmap()


K = TypeVar("K")
V = TypeVar("V")


def thawed(frozen: PMap[K, V]) -> dict[K, V]:
    """``frozen`` as a dict (``dict(frozen)`` would first build a set of its keys)."""
    return dict(frozen.items()) if frozen else {}


FEW_LANES = 4  # a target with up to this many lanes ranks its heads directly (statemachine.heads otherwise)


class Work:
    def __init__(self, state: State) -> None:
        self.state = state
        self.settings = state.settings
        self.policy = state.settings.policy
        self.now = state.now
        self.requests = state.requests.evolver()
        self.queues: dict[str, TargetQueue] = thawed(state.queues)
        self.queues_moved = False  # whether freeze() must build the map of queues again
        self.waiting = state.waiting
        self.replicas: dict[int, Replica] = {r.id: r for r in state.replicas}
        self.by_model: dict[str, tuple[int, ...]]
        self.memo: dict[str, tuple[bool, int]]
        index = state.index
        if index is not None and index.valid_for(state):
            self.by_model = dict(index.by_model)
            self.memo = dict(index.memo)
        else:
            by_model: dict[str, list[int]] = {}
            for r in state.replicas:
                by_model.setdefault(r.model, []).append(r.id)
            self.by_model = {model: tuple(ids) for model, ids in by_model.items()}
            self.memo = {}
        self.models = state.settings.model_table
        self.next_replica = state.next_replica
        self.next_seq = state.next_seq
        self.last_used = state.last_used.evolver()
        self.loaded_at = state.loaded_at.evolver()
        self.shutting_down = state.shutting_down
        self.deadline = state.deadline
        self.stopped = state.stopped
        self.wake_at = state.wake_at
        self.retired = state.retired.evolver()
        self.failing: set[str] = set(state.failing) if state.failing else set()
        self.peer_inflight: dict[str, PSet[int]] = thawed(state.peer_inflight)
        self.peers_down: dict[str, str] = thawed(state.peers_down)
        self.fair = FairShare(state.fair, state.vclock)
        self.queued_by_key = state.queued_by_key.evolver()
        self.overtaken: dict[int, int] = thawed(state.overtaken)
        self.load_seconds = state.load_seconds.evolver()
        self.wanted: list[str] = list(state.wanted)
        self.keep_alive = state.keep_alive.evolver()
        self.foreign = state.foreign
        heads = state.heads
        self.heads = heads if isinstance(heads, HeadIndex) and heads.owner is state else HeadIndex()
        self.overflow: list[tuple[int, RejectCode]] = []  # admitted over a bound: rejected unless they go now
        self.cmds: list[Command] = []

    def freeze(self) -> State:
        replicas = tuple(self.replicas.values())
        frozen = State(
            settings=self.settings,
            now=self.now,
            requests=self.requests.persistent(),
            queues=pmap(self.queues) if self.queues_moved else self.state.queues,
            waiting=self.waiting,
            replicas=replicas,
            next_replica=self.next_replica,
            next_seq=self.next_seq,
            last_used=self.last_used.persistent(),
            loaded_at=self.loaded_at.persistent(),
            shutting_down=self.shutting_down,
            deadline=self.deadline,
            stopped=self.stopped,
            wake_at=self.wake_at,
            retired=self.retired.persistent(),
            failing=pset(m for m in self.failing if self.live_replicas(m)) if self.failing else pset(),
            peer_inflight=pmap(self.peer_inflight) if self.peer_inflight else pmap(),
            peers_down=pmap(self.peers_down) if self.peers_down else pmap(),
            fair=self.fair.persistent(),
            vclock=self.fair.vclock,
            queued_by_key=self.queued_by_key.persistent(),
            overtaken=self._overtaken(),
            load_seconds=self.load_seconds.persistent(),
            wanted=tuple(self.wanted),
            keep_alive=self.keep_alive.persistent(),
            foreign=self.foreign,
            index=ReplicaIndex(replicas, self.settings, self.by_model, self.memo),
            heads=self.heads,
        )
        self.heads.owner = frozen
        return frozen

    def _overtaken(self) -> PMap[int, int]:
        """The counts of requests still waiting (the others are forgotten)."""
        if not self.overtaken:
            return EMPTY_COUNTS
        return pmap({rid: n for rid, n in self.overtaken.items() if self.is_queued(rid)})

    # ----------------------------------------------------------------- reading
    def request(self, rid: int) -> Request | None:
        return self.requests[rid] if rid in self.requests else None  # noqa: SIM401 (evolver)

    def queued_of(self, key: str) -> int:
        """How many requests of ``key`` wait."""
        return self.queued_by_key[key] if key in self.queued_by_key else 0  # noqa: SIM401 (evolver)

    def queue(self, target: str) -> TargetQueue:
        return self.queues.get(target, EMPTY_QUEUE)

    def is_queued(self, rid: int) -> bool:
        return rid in self.requests and self.requests[rid].phase == QUEUED

    def model(self, name: str) -> ModelSpec:
        return self.models[name]

    def spec_of(self, replica: Replica) -> ModelSpec:
        """The spec a replica runs with: the configured one, or the one it kept when a reload retired it."""
        if replica.id in self.retired:
            return self.retired[replica.id]
        return self.models[replica.model]

    def is_pinned(self, model: str) -> bool:
        """Pinned in the current configuration (a model a reload removed is not)."""
        spec = self.models.get(model)
        return spec is not None and spec.pinned

    def replicas_of(self, model: str) -> list[Replica]:
        """The model's replicas in id order."""
        replicas = self.replicas
        return [replicas[i] for i in self.by_model.get(model, ())]

    def live_replicas(self, model: str) -> list[Replica]:
        """Replicas that serve or will serve: loading or ready, not draining, not stopping."""
        return [r for r in self.replicas_of(model) if r.phase != STOPPING and not r.draining]

    def free_replica(self, model: str, prefix: Chain = (), avoid: set[int] | None = None) -> Replica | None:
        """The ready replica with a free slot that gets a request with prefix chain ``prefix`` (none on a GPU
        in ``avoid``).

        Least busy: the fewest requests in flight, ties to the lowest id. With a chain, the replicas at most
        ``affinity_guard`` busier than that compete on the longest part of the chain they remember; the least
        busy rule decides between equal matches, and alone when nothing matches.
        """
        slots = self.models[model].slots
        best: Replica | None = None
        best_load = slots
        replicas = self.replicas
        ids = self.by_model.get(model, ())
        for i in ids:
            r = replicas[i]
            load = len(r.inflight)
            if load < best_load and r.phase == READY and not r.draining:
                if avoid and not avoid.isdisjoint(r.gpus):
                    continue
                best, best_load = r, load
        if best is None or not prefix:
            return best
        limit = min(best_load + self.policy.affinity_guard, slots - 1)
        chosen, chosen_load, chosen_match = best, best_load, 0
        for i in ids:
            r = replicas[i]
            load = len(r.inflight)
            if load > limit or not r.memory or r.phase != READY or r.draining:
                continue
            if avoid and not avoid.isdisjoint(r.gpus):
                continue
            match = shared(r.memory, prefix)
            if match > chosen_match or (match == chosen_match and match and load < chosen_load):
                chosen, chosen_load, chosen_match = r, load, match
        return chosen

    def peer_free(self, peer: str) -> bool:
        """``peer`` is up and fewer than its ``max_in_flight`` requests are forwarded to it now."""
        if peer in self.peers_down:
            return False
        inflight = self.peer_inflight.get(peer)
        return (0 if inflight is None else len(inflight)) < self.settings.peer_limit(peer)

    def status(self, model: str) -> tuple[bool, int]:
        """(has a ready replica with a free slot, number of live replicas), remembered until it changes."""
        known = self.memo.get(model)
        if known is None:
            known = (self.free_replica(model) is not None, len(self.live_replicas(model)))
            self.memo[model] = known
        return known

    def touched(self, model: str) -> None:
        self.memo.pop(model, None)

    def has_queued(self, model: str) -> bool:
        queues = self.queues
        if model in queues and queues[model].count:
            return True
        return any(pool in queues and queues[pool].count for pool in self.settings.pools_of(model))

    def last_use(self, model: str) -> float:
        if model in self.last_used:
            return self.last_used[model]
        return self.loaded_at[model] if model in self.loaded_at else self.now  # noqa: SIM401

    # ------------------------------------------------------------- requests
    def enqueue(self, request: Request) -> None:
        self.requests[request.rid] = request
        target, lane = request.target, request.lane
        self._count_in(request)
        old = self.queue(target)
        self._queue_moved(target, old, old.push(lane, request.rid), lane)

    def requeue(self, request: Request) -> None:
        """Put an admitted request back at its arrival place (it waits again, never as an overflow)."""
        self.requests[request.rid] = request
        target, lane = request.target, request.lane
        self._count_in(request)
        old = self.queue(target)

        def seq_of(rid: int) -> int:
            return self.requests[rid].seq

        self._queue_moved(target, old, old.insert(lane, request.rid, seq_of, self.is_queued), lane)

    def _count_in(self, request: Request) -> None:
        self.waiting += 1
        key = request.key
        waiting = self.queued_of(key)
        if not waiting:
            self.fair.waits_again(key)
        self.queued_by_key[key] = waiting + 1

    def _queue_moved(self, target: str, old: TargetQueue, new: TargetQueue, lane: Lane) -> None:
        """``new`` replaces ``old`` as ``target``'s queue (none left when it is empty); of its lanes only
        ``lane`` changed. The index of lane heads follows."""
        heads = self.heads.following(target, old)
        self.queues_moved = True
        if not new.count:
            self.queues.pop(target, None)  # its heads, if indexed, are built again when it next has some
            return
        self.queues[target] = new
        if heads is None:
            return
        head = new.head(lane)
        if head == old.head(lane):
            heads.kept(new)
        else:
            heads.moved(new, None if head is None else self.requests[head], self.fair)

    def best_head(self, target: str) -> tuple[Rank, Request] | None:
        """The first-ranked of the heads of ``target``'s lanes (None: nothing waits for it)."""
        queue = self.queues.get(target)
        if queue is None:
            return None
        if len(queue.lanes) <= FEW_LANES:  # ranking each head costs less than keeping heaps
            best: tuple[Rank, Request] | None = None
            for rid in queue.heads():
                request = self.requests[rid]
                ranked = rank(self.policy, self.fair, request, self.now)
                if best is None or ranked < best[0]:
                    best = (ranked, request)
            return best
        heads = self.heads.of(target, queue, self.requests, self.fair)
        return heads.best(self.requests, self.policy, self.now, self.fair)

    def unqueue(self, request: Request) -> None:
        """Take a queued request out of its queue and forget it."""
        self.requests.remove(request.rid)
        self._leave_queue(request)

    def _leave_queue(self, request: Request) -> None:
        """``request`` (no longer queued in ``requests``) leaves its target's queue."""
        target, lane = request.target, request.lane
        old = self.queue(target)
        self._queue_moved(target, old, old.drop(lane, request.rid, self.is_queued), lane)
        self.waiting -= 1
        left = self.queued_by_key[request.key] - 1
        if left:
            self.queued_by_key[request.key] = left
        else:
            del self.queued_by_key[request.key]

    def reject(self, request: Request, code: RejectCode, message: str) -> None:
        """End a queued or in-flight request with an error."""
        if request.phase == QUEUED:
            self.unqueue(request)
        else:
            self.release(request)
        self.cmds.append(Reject(request.rid, code, message))

    def _served(self, request: Request) -> None:
        """It leaves its queue for a dispatch (or a forward): its key's tag moves on first (fair share), so
        that the lane's next head is indexed under the tag it will be ranked by."""
        self.fair.serve(request.key, self.settings.weight(request.key))
        self.requests.remove(request.rid)
        self._leave_queue(request)

    def dispatch(self, request: Request, replica: Replica, model: str) -> None:
        self._served(request)
        self._on_replica(request, replica, model)

    def dispatch_at_once(self, request: Request, replica: Replica, model: str) -> None:
        """Dispatch a request that has just arrived, while nothing waits, without passing it through its
        queue: what ``enqueue`` and then ``dispatch`` leave, without the queue's coming and going."""
        self.fair.waits_again(request.key)  # it had nothing waiting (nothing does)
        self.fair.serve(request.key, self.settings.weight(request.key))
        self._on_replica(request, replica, model)

    def _on_replica(self, request: Request, replica: Replica, model: str) -> None:
        self.requests[request.rid] = attrs.evolve(request, phase=INFLIGHT, replica=replica.id, model=model)
        memory = replica.memory
        if request.prefix:
            bound = self.policy.affinity_memory * self.spec_of(replica).slots
            memory = remember(memory, request.prefix, bound)
        self.replicas[replica.id] = attrs.evolve(
            replica, inflight=replica.inflight.add(request.rid), memory=memory
        )
        self.touched(replica.model)
        self.last_used[model] = self.now
        if request.keep_alive is not None:
            self.keep_alive[model] = request.keep_alive
        self.cmds.append(Dispatch(request.rid, replica.id, model))

    def forward(self, request: Request, peer: str, model: str) -> None:
        """Send a queued request to ``peer``, which serves ``model``."""
        self._served(request)
        self.requests[request.rid] = attrs.evolve(request, phase=INFLIGHT, peer=peer, model=model)
        self.peer_inflight[peer] = self.peer_inflight.get(peer, pset()).add(request.rid)
        self.last_used[model] = self.now
        self.cmds.append(Forward(request.rid, peer, model))

    def release(self, request: Request) -> None:
        """Forget an in-flight request and free its slot (on its replica, or its place at its peer)."""
        self.requests.remove(request.rid)
        if request.model is not None:
            self.last_used[request.model] = self.now
        if request.peer is not None:
            left = self.peer_inflight[request.peer].remove(request.rid)
            if left:
                self.peer_inflight[request.peer] = left
            else:
                del self.peer_inflight[request.peer]
            return
        assert request.replica is not None
        replica = self.replicas.get(request.replica)
        if replica is not None:
            self.replicas[replica.id] = attrs.evolve(replica, inflight=replica.inflight.remove(request.rid))
            self.touched(replica.model)

    # ------------------------------------------------------------- replicas
    def put(self, replica: Replica) -> None:
        """Store a changed replica (same id, same model)."""
        self.replicas[replica.id] = replica
        self.touched(replica.model)

    def spawn(self, model: ModelSpec, reason: str, request: int | None) -> None:
        """Start a replica of ``model`` for waiting ``request`` (None: asked for, at Startup or by
        LoadRequested)."""
        rid = self.next_replica
        self.next_replica += 1
        self.replicas[rid] = Replica(
            id=rid,
            model=model.name,
            gpus=model.gpus,
            phase=LOADING,
            spawned_at=self.now,
            asked=request is None,
        )
        self.by_model[model.name] = (*self.by_model.get(model.name, ()), rid)
        self.failing.discard(model.name)  # a failing model starts again only once none of it is live
        self.touched(model.name)
        if model.name not in self.loaded_at:
            self.loaded_at[model.name] = self.now
        self.cmds.append(Spawn(rid, model.name, model.gpus, reason, request))

    def kill(self, replica: Replica, reason: str, cause: KillCause, eviction: Eviction | None = None) -> None:
        if replica.phase == STOPPING:
            return
        self.replicas[replica.id] = attrs.evolve(replica, phase=STOPPING, forced=bool(replica.inflight))
        self.touched(replica.model)
        self.cmds.append(Kill(replica.id, replica.model, reason, cause, eviction))

    def drop_replica(self, replica: Replica) -> None:
        del self.replicas[replica.id]
        if replica.id in self.retired:
            self.retired.remove(replica.id)
        self.touched(replica.model)
        ids = tuple(i for i in self.by_model[replica.model] if i != replica.id)
        if ids:
            self.by_model[replica.model] = ids
        else:
            del self.by_model[replica.model]
            if replica.model in self.loaded_at:
                self.loaded_at.remove(replica.model)
            if replica.model in self.keep_alive:
                self.keep_alive.remove(replica.model)  # a request's keep-alive lasts one residency

    # ------------------------------------------------------------ residency
    def fits(self, model: ModelSpec, gpu: int, extra: int, gone: set[str], count_stopping: bool) -> bool:
        """Would ``extra`` more replicas of ``model`` fit on ``gpu`` once the models in ``gone`` left?"""
        residents = {model.name}
        used = model.need_on(gpu) * extra
        for r in self.replicas.values():
            if gpu not in r.gpus or r.model in gone or (r.phase == STOPPING and not count_stopping):
                continue
            residents.add(r.model)
            used += self.spec_of(r).need_for(r.gpus, gpu)
        if len(residents) > self.policy.max_models_per_gpu:
            return False
        budget = self.settings.budget(gpu)
        return budget is None or used + self.foreign_on(gpu) <= budget

    def overcommitted(self, gpu: int) -> bool:
        """Other processes' memory and the needs of the replicas that stay (not stopping) exceed ``gpu``'s
        budget: loads there wait, and no resident is evicted for them, until that memory is back."""
        budget = self.settings.budget(gpu)
        if budget is None or not self.foreign_on(gpu):
            return False
        staying = sum(
            self.spec_of(r).need_for(r.gpus, gpu)
            for r in self.replicas.values()
            if gpu in r.gpus and r.phase != STOPPING
        )
        return staying + self.foreign_on(gpu) > budget

    def foreign_on(self, gpu: int) -> int:
        """Bytes of ``gpu`` other processes hold beyond what its budget leaves them (ForeignMemory)."""
        foreign = self.foreign
        return foreign[gpu] if gpu in foreign else 0  # noqa: SIM401 (a persistent map)
