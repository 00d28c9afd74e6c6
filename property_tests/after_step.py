"""The checks made once a step's commands are all accounted for: what the pass left waiting (INV-LOAD-FITS,
INV-UNSERVABLE, INV-WAKE-EARLIEST, INV-ORDER, INV-LIMITS), what it had to do in that step (INV-CANCEL,
INV-KILL-IDLE, INV-LOAD-FAILURE, INV-REDISPATCH, INV-RELOAD, INV-UNLOAD, INV-SHUTDOWN, INV-WAKE), and that
the scheduler's request table matches the environment's (INV-CONSERVATION).
"""

from __future__ import annotations

from statemachine import Dispatch, Reject
from statemachine.state import INFLIGHT, QUEUED

from .evictions import EvictionChecks
from .views import ORPHANED, RUNNING, TERMINAL, WAITING, eligible


class AfterStepChecks(EvictionChecks):
    """The end of a step: the state the commands left behind against what the spec asks of it."""

    # ---------------------------------------------------------------------------------- after the step
    def after_commands(self) -> None:
        w, s, e = self.w, self.s, self.event
        if self.gone_running is not None:
            named = [
                c for c in self.commands if isinstance(c, Dispatch | Reject) and c.rid == self.gone_running
            ]
            if named or self.gone_running in self.state.requests:
                self.fail("INV-CANCEL", f"{e} of a running request left it behind: {named}")
        if self.kill_expected is not None:
            self.fail("INV-KILL-IDLE", f"{e} yielded no Kill of the failed replica")
        if self.abandoned:
            self.fail(
                "INV-ABANDON", f"{e} left loads nothing needs running: replicas {sorted(self.abandoned)}"
            )
        for request in w.requests.values():
            if request.status == ORPHANED:
                self.fail("INV-CONSERVATION", f"request {request.rid} lost its replica but was not rejected")
                request.status = "rejected"
        arrival = self.arrival
        if arrival is not None and arrival.status in (WAITING, RUNNING):
            if w.shutting_down:
                self.fail("INV-SHUTDOWN", f"request {arrival.rid} admitted during shutdown")
            if not eligible(s, arrival.target, arrival.tokens):
                self.fail(
                    "INV-ADMISSION", f"request {arrival.rid} for {arrival.target!r} admitted, no model fits"
                )
        if self.refused is not None and self.put_back_gone:
            refused = w.requests[self.refused]
            if refused.status != "rejected":
                self.fail("INV-REDISPATCH", f"request {self.refused} cannot wait again but was not answered")
            elif refused.outcome != self.refused_answer(refused):
                want = self.refused_answer(refused)
                self.fail("INV-REDISPATCH", f"request {refused.rid} answered {refused.outcome}, not {want}")
        elif self.refused is not None and w.requests[self.refused].status in TERMINAL:
            self.fail(
                "INV-REDISPATCH", f"request {self.refused} ended although it only needed another replica"
            )
        for rid in self.unloading + self.retiring:
            replica = w.replicas.get(rid)
            if replica is not None and not replica.killed:
                replica.draining = True
        for rid in self.retiring:
            replica = w.replicas.get(rid)
            if replica is not None and not replica.killed and not replica.inflight:
                self.fail("INV-RELOAD", f"retired replica {rid} is idle but was not killed")
        for rid in self.vanished:
            request = w.requests[rid]
            if request.status != "rejected" or request.outcome != "model_not_found":
                self.fail("INV-RELOAD", f"request {rid} for a removed target is {request.status}")
        if self.state.wake_at is not None and self.state.wake_at != w.wake:
            self.fail("INV-WAKE", f"the scheduler waits for {self.state.wake_at} but asked for {w.wake}")
        self.check_load_failure()
        self.check_heads()
        self.check_limits()
        self.check_order()
        self.check_drained()
        self.check_shutdown()
        self.check_conservation()
        w.failing = {m for m in w.failing if w.live_count(m)}

    def check_load_failure(self) -> None:
        if self.load_failure is None:
            return
        model, doomed = self.load_failure
        for rid in doomed:
            request = self.w.requests[rid]
            if request.status != "rejected":
                self.fail(
                    "INV-LOAD-FAILURE", f"request {rid} still {request.status} after {model} failed to load"
                )

    def check_heads(self) -> None:
        """What the pass left waiting: INV-LOAD-FITS, INV-UNSERVABLE, and the wake-up it asked for."""
        w, policy = self.w, self.s.policy
        wake: list[float] = []
        if w.shutting_down:
            if w.deadline is not None and w.now < w.deadline:
                wake.append(w.deadline)
        elif any(self.s.models[m].pinned for _, m in self.spawns):
            return  # a pinned model loaded by a later request may have changed what earlier ones can load
        else:
            held: set[int] = set()
            spawned = {rid for rid, _ in self.spawns}
            protected: set[str] = set()
            for q in w.heads():
                plan = w.load_plan(q)
                names = eligible(self.s, q.target, q.tokens)
                earlier = [r for r in self.unavailable if r.order < q.order]
                protected |= set(names).union(*(eligible(self.s, r.target, r.tokens) for r in earlier))
                if plan is None:
                    if not any(w.live_count(n) for n in names):
                        self.fail("INV-UNSERVABLE", f"request {q.rid} waits, but nothing can ever serve it")
                    continue
                if q.rid in spawned:
                    continue
                name, count = plan
                spec = self.s.models[name]
                gpus = set(spec.gpus)
                if not w.claimed(q):
                    wake.append(q.arrived + policy.claim_after)
                if not held & gpus and all(w.fits(spec, g, count, set()) for g in spec.gpus):
                    self.fail(
                        "INV-LOAD-FITS",
                        f"request {q.rid} waits although {count} replica(s) of {name} fit on {sorted(gpus)}",
                    )
                elif not held & gpus:
                    self.missed_eviction(q, spec, count, protected)
                if w.claimed(q):
                    held |= gpus
            wake += self.ttl_wakes()
        expected = min(wake) if wake else None
        if self.state.wake_at != expected:
            self.fail("INV-WAKE-EARLIEST", f"the scheduler wakes at {self.state.wake_at}, not {expected}")

    def ttl_due(self, model: str) -> bool:
        """The model's idle time has run out: a ttl, not pinned, all its replicas idle, nothing queued."""
        w, spec = self.w, self.s.models.get(model)
        if spec is None or spec.ttl is None or spec.pinned:
            return False
        replicas = [r for r in w.of_model(model) if not r.killed]
        if any(r.inflight or r.loading for r in replicas) or w.has_queued(model):
            return False
        return max(w.loaded_at.get(model, w.now), w.last_used.get(model, float("-inf"))) + spec.ttl <= w.now

    def ttl_wakes(self) -> list[float]:
        """When each idle model with a ttl expires (none loading, none in flight, nothing queued for it)."""
        w, out = self.w, []
        for name, spec in self.s.models.items():
            if spec.ttl is None or spec.pinned:
                continue
            replicas = [r for r in w.of_model(name) if not r.killed]
            if not replicas or any(r.inflight or r.loading for r in replicas) or w.has_queued(name):
                continue
            since = max(w.loaded_at.get(name, w.now), w.last_used.get(name, float("-inf")))
            if since + spec.ttl > w.now:
                out.append(since + spec.ttl)
        return out

    def check_limits(self) -> None:
        """Requests never dispatched stay within the limits; those put back by DispatchFailed may not."""
        waiting = [r for r in self.w.waiting() if not r.put_back]
        policy = self.s.policy
        if len(waiting) > policy.queue_limit:
            self.fail("INV-LIMITS", f"{len(waiting)} requests wait, queue_limit is {policy.queue_limit}")
        for pool in self.s.pools:
            count = sum(1 for r in waiting if r.target == pool)
            if count > policy.routing_queue_limit:
                self.fail("INV-LIMITS", f"{count} wait for pool {pool}, limit {policy.routing_queue_limit}")

    def check_order(self) -> None:
        """No later request is dispatched or loaded on the GPUs an earlier claiming request waits to swap."""
        w = self.w
        seen: set[str] = set()
        for r1 in w.waiting():
            if r1.target in seen:
                continue
            seen.add(r1.target)
            if not w.claimed(r1) or any(rid == r1.rid for rid, _ in self.spawns):
                continue  # not claiming yet, or its own load started in this step (no swap to wait for)
            model = w.load_target(r1)
            if model is None or w.of_model(model) or w.fits_one(model):
                continue
            gpus = set(self.s.models[model].gpus)
            for r2, m2 in self.dispatches:
                if r2.order > r1.order and gpus.intersection(self.s.models[m2].gpus):
                    self.fail(
                        "INV-ORDER",
                        f"request {r2.rid} ({m2}) went ahead of request {r1.rid}, which waits to swap in "
                        f"{model} on GPU {sorted(gpus)}",
                    )
            for rid, m2 in self.spawns:
                r2 = w.requests.get(rid)
                if r2 is not None and r2.order > r1.order and gpus.intersection(self.s.models[m2].gpus):
                    self.fail(
                        "INV-ORDER",
                        f"request {rid} loaded {m2} ahead of request {r1.rid}, which waits for {model}",
                    )

    def check_drained(self) -> None:
        for replica in self.w.replicas.values():
            if replica.draining and not replica.killed and not replica.inflight:
                self.fail("INV-UNLOAD", f"replica {replica.id} is unloaded and idle but was not killed")

    def check_shutdown(self) -> None:
        w = self.w
        if not w.shutting_down:
            return
        if w.waiting():
            self.fail("INV-SHUTDOWN", "requests still wait after shutdown began")
        due = w.deadline is not None and w.now >= w.deadline
        for replica in w.replicas.values():
            if not replica.killed and (due or not replica.inflight):
                self.fail("INV-SHUTDOWN", f"replica {replica.id} survives shutdown (due={due})")
        if not w.replicas and not w.stopped:
            self.fail("INV-SHUTDOWN", "no replica is left but Stopped was not sent")

    def check_conservation(self) -> None:
        """The scheduler's request table matches the environment's: same ids, same phase, same replica."""
        phases = {WAITING: QUEUED, RUNNING: INFLIGHT}
        live = {rid: r for rid, r in self.w.requests.items() if r.status not in TERMINAL}
        state_requests = self.state.requests
        for rid, request in live.items():
            mine = state_requests.get(rid)
            if mine is None:
                self.fail(
                    "INV-CONSERVATION", f"request {rid} is {request.status} but the scheduler forgot it"
                )
            elif mine.phase != phases[request.status] or (
                request.status != WAITING and mine.replica != request.replica
            ):
                self.fail(
                    "INV-CONSERVATION",
                    f"request {rid} is {request.status} on {request.replica}, scheduler says {mine.phase} "
                    f"on {mine.replica}",
                )
        for rid in state_requests:
            if rid not in live:
                self.fail("INV-CONSERVATION", f"the scheduler holds request {rid}, which has ended")
        if self.arrival is not None and self.arrival.status not in (WAITING, RUNNING, "rejected"):
            self.fail("INV-CONSERVATION", f"arrival {self.arrival.rid} ended as {self.arrival.status}")
