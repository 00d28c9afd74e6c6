"""One step as the environment sees it: the record it keeps while the step's commands are walked, and the
bookkeeping of the event itself (the clock, an arrival, a finish, a refused dispatch, a failure, an exit, an
unload, a reload, a shutdown), done before any command is looked at. The checks by subject build on
``StepBase``: evictions.py, answers.py, after_step.py and command_checks.py; world.py runs them.
"""

from __future__ import annotations

from collections import defaultdict

from statemachine import (
    ClientGone,
    Command,
    DispatchFailed,
    Event,
    LoadFailed,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    SettingsChanged,
    ShutdownRequested,
    State,
    Tick,
    UnloadRequested,
)

from .views import ORPHANED, TERMINAL, WAITING, Findings, ReplicaView, RequestView, WorldView, eligible


class StepBase:
    """What one step records as it goes, how it files a violation, and what the event itself changes."""

    def __init__(self, world: WorldView, event: Event, commands: tuple[Command, ...], state: State) -> None:
        self.w = world
        self.s = world.settings
        self.event = event
        self.commands = commands
        self.state = state
        self.found: Findings = defaultdict(list)
        self.arrival: RequestView | None = None
        self.arrival_over_limit = False
        self.gone_running: int | None = None
        self.kill_expected: int | None = None
        self.abandoned: set[int] = set()  # loading replicas the departure of a waiting request stops
        self.load_failure: tuple[str, list[int]] | None = None
        self.unloading: list[int] = []
        self.retiring: list[int] = []
        self.refused: int | None = None
        self.put_back_gone = False
        self.vanished: list[int] = []
        self.dispatches: list[tuple[RequestView, str]] = []
        self.spawns: list[tuple[int, str]] = []
        self.unavailable: list[RequestView] = []  # answered 503 model_unavailable by this step's pass
        self.left: list[RequestView] = []  # left the queue during the pass: dispatched, or rejected by it
        self.position = 0

    def refused_answer(self, request: RequestView) -> RejectCode:
        """How a request put back by DispatchFailed must be answered when it cannot wait (INV-REDISPATCH)."""
        if self.w.shutting_down:
            return RejectCode.SHUTTING_DOWN
        if request.target not in self.s.models and request.target not in self.s.pools:
            return RejectCode.MODEL_NOT_FOUND
        return RejectCode.MODEL_UNAVAILABLE

    def fail(self, inv: str, message: str) -> None:
        self.found[inv].append(message)

    # ------------------------------------------------------------------------------- the event itself
    def before_commands(self) -> None:
        w, e = self.w, self.event
        if isinstance(e, Tick):
            w.now = e.now
        elif isinstance(e, RequestArrived):
            w.arrivals += 1
            request = RequestView(e.rid, e.target, e.tokens, w.now, w.arrivals, prefix=e.prefix)
            pool = self.s.pools.get(e.target)
            waiting = w.waiting()
            self.arrival_over_limit = len(waiting) >= self.s.policy.queue_limit or (
                pool is not None
                and sum(1 for r in waiting if r.target == pool.name) >= self.s.policy.routing_queue_limit
            )
            w.requests[e.rid] = request
            self.arrival = request
        elif isinstance(e, ClientGone):
            request = w.requests[e.rid]
            if request.status == WAITING:
                self.end(request, "left")
                self.abandoned = w.abandoned(request)
            else:
                # The shell has closed the exchange: the slot is free in this very step (INV-CANCEL).
                self.free_slot(request)
                if request.model is not None:
                    w.last_used[request.model] = w.now
                self.end(request, "closed")
                self.gone_running = e.rid
        elif isinstance(e, RequestFinished):
            request = w.requests[e.rid]
            replica = w.replicas.get(request.replica) if request.replica is not None else None
            if e.broken and replica is not None and not replica.killed:
                replica.draining = replica.broke = True  # INV-BROKEN: it takes no new work
            self.free_slot(request)
            if request.model is not None:
                w.last_used[request.model] = w.now
            self.end(request, "finished")
        elif isinstance(e, DispatchFailed):
            request = w.requests[e.rid]
            replica = w.replicas[request.replica] if request.replica is not None else None
            self.free_slot(request)
            if request.model is not None:
                w.last_used[request.model] = w.now
            request.status, request.replica, request.put_back = WAITING, None, True
            request.model = None
            w.dispatched.discard(e.rid)  # nothing reached the replica: it may be dispatched again
            # It cannot wait when stopping, or when a reload left nothing that could serve it.
            self.put_back_gone = w.shutting_down or not eligible(self.s, request.target, request.tokens)
            if replica is not None and not replica.killed:
                replica.draining = True  # it takes no new work from now on
            self.refused = e.rid
        elif isinstance(e, ReplicaReady):
            w.replicas[e.replica].ready = True
            w.failing.discard(w.replicas[e.replica].model)
        elif isinstance(e, LoadFailed):
            replica = w.replicas[e.replica]
            self.kill_expected = replica.id
            self.note_load_failure(replica)
        elif isinstance(e, ReplicaUnresponsive):
            replica = w.replicas.get(e.replica)
            if replica is not None and not replica.killed:
                replica.hung = True
                self.kill_expected = replica.id  # INV-UNRESPONSIVE: it is killed in this very step
        elif isinstance(e, ReplicaExited):
            replica = w.replicas.pop(e.replica)
            if not w.of_model(replica.model):
                w.loaded_at.pop(replica.model, None)  # its residency is over
            if replica.loading:
                self.note_load_failure(replica)
            for rid in sorted(replica.inflight):
                w.requests[rid].status = ORPHANED
        elif isinstance(e, UnloadRequested):
            self.unloading = [r.id for r in w.replicas.values() if e.model is None or r.model == e.model]
            self.mark_draining(self.unloading)
        elif isinstance(e, SettingsChanged):
            self.reload(e)
        elif isinstance(e, ShutdownRequested):
            w.shutting_down = True
            w.deadline = e.deadline if w.deadline is None else min(w.deadline, e.deadline)

    def reload(self, e: SettingsChanged) -> None:
        """Replicas of removed, moved or restarted models retire; the others take the new spec."""
        w, old, new = self.w, self.s, e.settings
        retire = set(e.restart)
        for name, spec in old.models.items():
            fresh = new.models.get(name)
            if fresh is None or (spec.gpus, spec.slots, spec.need) != (fresh.gpus, fresh.slots, fresh.need):
                retire.add(name)
        for replica in w.replicas.values():
            if replica.model in retire:
                if not replica.killed and not replica.retired:
                    self.retiring.append(replica.id)
                replica.retired = True
            elif not replica.retired:
                replica.spec = new.models[replica.model]
        self.vanished = [
            r.rid for r in w.waiting() if r.target not in new.models and r.target not in new.pools
        ]
        w.settings = self.s = new
        self.mark_draining(self.retiring)

    def mark_draining(self, ids: list[int]) -> None:
        """Replicas an unload or a reload takes out of service: no new work from this step on."""
        for rid in ids:
            replica = self.w.replicas.get(rid)
            if replica is not None and not replica.killed:
                replica.draining = True

    def note_load_failure(self, replica: ReplicaView) -> None:
        others = [r for r in self.w.of_model(replica.model) if r.id != replica.id and r.live]
        if others:
            self.w.failing.add(replica.model)
            return
        self.w.failing.discard(replica.model)
        doomed = [
            r.rid
            for r in self.w.waiting()
            if r.target == replica.model or eligible(self.s, r.target, r.tokens) == [replica.model]
        ]
        self.load_failure = (replica.model, doomed)

    def end(self, request: RequestView, outcome: str) -> None:
        if request.status in TERMINAL:
            self.fail(
                "INV-CONSERVATION", f"request {request.rid} ends twice ({request.status}, then {outcome})"
            )
        request.status = outcome

    def free_slot(self, request: RequestView) -> None:
        if request.replica is not None and request.replica in self.w.replicas:
            self.w.replicas[request.replica].inflight.discard(request.rid)
