"""A working copy of the state for one ``step()``: primitive changes that also record their commands.

``step()`` never mutates its input: it builds a ``Work`` over the old state, applies the event's rule and the
scheduling pass to it, then freezes it into the next ``State``.
"""

from __future__ import annotations

import attrs

from .commands import CancelUpstream, Command, Dispatch, Kill, Reject, Spawn
from .fifo import Fifo
from .settings import ModelSpec
from .state import CANCELLING, INFLIGHT, LOADING, QUEUED, STOPPING, Replica, Request, State


class Work:
    def __init__(self, state: State) -> None:
        self.state = state
        self.settings = state.settings
        self.policy = state.settings.policy
        self.now = state.now
        self.requests = state.requests.evolver()
        self.queues = state.queues.evolver()
        self.waiting = state.waiting
        self.replicas: dict[int, Replica] = {r.id: r for r in state.replicas}
        self.next_replica = state.next_replica
        self.next_seq = state.next_seq
        self.last_used = state.last_used.evolver()
        self.loaded_at = state.loaded_at.evolver()
        self.shutting_down = state.shutting_down
        self.deadline = state.deadline
        self.stopped = state.stopped
        self.wake_at = state.wake_at
        self.overflow: list[int] = []
        self.cmds: list[Command] = []

    def freeze(self) -> State:
        return State(
            settings=self.settings,
            now=self.now,
            requests=self.requests.persistent(),
            queues=self.queues.persistent(),
            waiting=self.waiting,
            replicas=tuple(self.replicas.values()),
            next_replica=self.next_replica,
            next_seq=self.next_seq,
            last_used=self.last_used.persistent(),
            loaded_at=self.loaded_at.persistent(),
            shutting_down=self.shutting_down,
            deadline=self.deadline,
            stopped=self.stopped,
            wake_at=self.wake_at,
        )

    # ----------------------------------------------------------------- reading
    def request(self, rid: int) -> Request | None:
        return self.requests[rid] if rid in self.requests else None  # noqa: SIM401 (evolver)

    def fifo(self, target: str) -> Fifo:
        return self.queues[target] if target in self.queues else Fifo()

    def is_queued(self, rid: int) -> bool:
        return rid in self.requests and self.requests[rid].phase == QUEUED

    def model(self, name: str) -> ModelSpec:
        return self.settings.models[name]

    def replicas_of(self, model: str) -> list[Replica]:
        return [r for r in self.replicas.values() if r.model == model]

    def live_replicas(self, model: str) -> list[Replica]:
        """Replicas that serve or will serve: loading or ready, not draining, not stopping."""
        return [
            r for r in self.replicas.values() if r.model == model and r.phase != STOPPING and not r.draining
        ]

    def free_replica(self, model: str) -> Replica | None:
        """The ready replica with the fewest requests in flight that has a free slot (ties: lowest id)."""
        slots = self.model(model).slots
        best: Replica | None = None
        for r in self.replicas.values():
            if r.model != model or r.phase != "ready" or r.draining or len(r.inflight) >= slots:
                continue
            if best is None or len(r.inflight) < len(best.inflight):
                best = r
        return best

    def has_queued(self, model: str) -> bool:
        if self.fifo(model).count:
            return True
        return any(self.fifo(pool).count for pool in self.settings.pools_of(model))

    def last_use(self, model: str) -> float:
        if model in self.last_used:
            return self.last_used[model]
        return self.loaded_at[model] if model in self.loaded_at else self.now  # noqa: SIM401

    # ------------------------------------------------------------- requests
    def enqueue(self, request: Request) -> None:
        self.requests[request.rid] = request
        self.queues[request.target] = self.fifo(request.target).push(request.rid)
        self.waiting += 1

    def unqueue(self, request: Request) -> None:
        """Take a queued request out of its queue and forget it."""
        self.requests.remove(request.rid)
        self.queues[request.target] = self.fifo(request.target).drop(request.rid, self.is_queued)
        self.waiting -= 1

    def reject(self, request: Request, status: int, code: str, message: str) -> None:
        """End a queued or in-flight request with an error."""
        if request.phase == QUEUED:
            self.unqueue(request)
        else:
            self.release(request)
        self.cmds.append(Reject(request.rid, status, code, message))

    def dispatch(self, request: Request, replica: Replica, model: str) -> None:
        self.requests.remove(request.rid)
        self.queues[request.target] = self.fifo(request.target).drop(request.rid, self.is_queued)
        self.waiting -= 1
        self.requests[request.rid] = attrs.evolve(request, phase=INFLIGHT, replica=replica.id, model=model)
        self.replicas[replica.id] = attrs.evolve(replica, inflight=replica.inflight.add(request.rid))
        self.last_used[model] = self.now
        self.cmds.append(Dispatch(request.rid, replica.id, model))

    def cancel(self, request: Request) -> None:
        assert request.replica is not None
        self.requests[request.rid] = attrs.evolve(request, phase=CANCELLING)
        self.cmds.append(CancelUpstream(request.rid, request.replica))

    def release(self, request: Request) -> None:
        """Forget an in-flight (or cancelling) request and free its slot."""
        self.requests.remove(request.rid)
        assert request.replica is not None
        replica = self.replicas.get(request.replica)
        if replica is not None:
            self.replicas[replica.id] = attrs.evolve(replica, inflight=replica.inflight.remove(request.rid))
        if request.model is not None:
            self.last_used[request.model] = self.now

    # ------------------------------------------------------------- replicas
    def spawn(self, model: ModelSpec, reason: str) -> None:
        rid = self.next_replica
        self.next_replica += 1
        self.replicas[rid] = Replica(
            id=rid, model=model.name, gpus=model.gpus, phase=LOADING, spawned_at=self.now
        )
        if model.name not in self.loaded_at:
            self.loaded_at[model.name] = self.now
        self.cmds.append(Spawn(rid, model.name, model.gpus, reason))

    def kill(self, replica: Replica, reason: str) -> None:
        if replica.phase == STOPPING:
            return
        self.replicas[replica.id] = attrs.evolve(replica, phase=STOPPING, forced=bool(replica.inflight))
        self.cmds.append(Kill(replica.id, replica.model, reason))

    def drop_replica(self, replica: Replica) -> None:
        del self.replicas[replica.id]
        if (
            not any(r.model == replica.model for r in self.replicas.values())
            and replica.model in self.loaded_at
        ):
            self.loaded_at.remove(replica.model)

    # ------------------------------------------------------------ residency
    def fits(self, model: ModelSpec, gpu: int, extra: int, gone: set[str], count_stopping: bool) -> bool:
        """Would ``extra`` more replicas of ``model`` fit on ``gpu`` once the models in ``gone`` left?"""
        residents = {model.name}
        used = model.need_on(gpu) * extra
        for r in self.replicas.values():
            if gpu not in r.gpus or r.model in gone or (r.phase == STOPPING and not count_stopping):
                continue
            residents.add(r.model)
            used += self.model(r.model).need_on(gpu)
        if len(residents) > self.policy.max_models_per_gpu:
            return False
        budget = self.settings.budget(gpu)
        return budget is None or used <= budget
