"""The commands of a step, walked in the order they came out: each ``Spawn``, ``Kill``, ``Dispatch``,
``WakeAt`` and ``Stopped`` is checked against the world's view at that moment (INV-IDS, INV-GPUS,
INV-REPLICAS, INV-CAP, INV-BUDGET, INV-KILL-IDLE, INV-NO-DOUBLE-DISPATCH, INV-DISPATCH-READY, INV-SLOTS,
INV-LEAST-LOADED and the affinity choice through affinity.py, INV-POOL-PRIORITY, INV-WAKE, INV-SHUTDOWN,
INV-CAUSE through causes.py) and then applied to it; a ``Reject`` goes to answers.py, an eviction ``Kill``
also to evictions.py.
"""

from __future__ import annotations

from statemachine import Command, Dispatch, Kill, Reject, Spawn, Stopped, UnloadRequested, WakeAt

from .affinity import choice_problems, remember
from .after_step import AfterStepChecks
from .answers import AnswerChecks
from .causes import kill_problem, spawn_problem
from .views import RUNNING, WAITING, ReplicaView, RequestView, eligible


class CommandChecks(AnswerChecks, AfterStepChecks):
    """Each command against the world's view, then into it."""

    # ----------------------------------------------------------------------------------- the commands
    def command(self, c: Command) -> None:
        if isinstance(c, Spawn):
            self.spawn(c)
        elif isinstance(c, Kill):
            self.kill(c)
        elif isinstance(c, Dispatch):
            self.dispatch(c)
        elif isinstance(c, Reject):
            self.reject(c)
        elif isinstance(c, WakeAt):
            if c.at <= self.w.now:
                self.fail("INV-WAKE", f"{c} is not in the future (now {self.w.now})")
            self.w.wake = c.at
        elif isinstance(c, Stopped):
            if not self.w.shutting_down or self.w.replicas or self.w.stopped:
                self.fail("INV-SHUTDOWN", f"Stopped while replicas {sorted(self.w.replicas)} remain")
            self.w.stopped = True

    def spawn(self, c: Spawn) -> None:
        w = self.w
        loaders = {
            r.rid: eligible(self.s, r.target, r.tokens)
            for r in w.waiting()
            if not (r is self.arrival and self.arrival_over_limit)
        }
        problem = spawn_problem(c, self.event, loaders)
        if problem:
            self.fail("INV-CAUSE", problem)
        spec = self.s.models.get(c.model)
        if c.replica in w.spawned_ids:
            self.fail("INV-IDS", f"replica id {c.replica} spawned twice")
        if spec is None or tuple(c.gpus) != tuple(spec.gpus):
            self.fail("INV-GPUS", f"{c} does not match the model's GPUs")
            return
        if w.shutting_down:
            self.fail("INV-SHUTDOWN", f"{c} after shutdown began")
        if c.model in w.failing:
            if w.live_count(c.model):
                self.fail("INV-FAILING", f"{c} while a failed load of {c.model} has not settled")
            w.failing.discard(c.model)  # none of it is live any more: a fresh start
        w.spawned_ids.add(c.replica)
        w.loaded_at.setdefault(c.model, w.now)
        w.replicas[c.replica] = ReplicaView(c.replica, c.model, tuple(c.gpus), spec, asked=c.request is None)
        if w.live_count(c.model) > spec.replicas:
            self.fail("INV-REPLICAS", f"{c} gives {c.model} {w.live_count(c.model)} live replicas")
        for gpu in c.gpus:
            residents = w.residents(gpu)
            if len(residents) > self.s.policy.max_models_per_gpu:
                self.fail("INV-CAP", f"{c} makes GPU {gpu} hold {sorted(residents)}")
            budget = self.s.budget(gpu)
            if budget is not None and w.used(gpu) > budget:
                self.fail("INV-BUDGET", f"{c} makes GPU {gpu} use {w.used(gpu)} of {budget} bytes")
        if c.request is not None:
            self.spawns.append((c.request, c.model))

    def kill(self, c: Kill) -> None:
        w = self.w
        replica = w.replicas.get(c.replica)
        if replica is None or replica.killed or replica.model != c.model:
            self.fail("INV-KILL-IDLE", f"{c} names no live replica of {c.model}")
            return
        if c.eviction is not None:
            self.eviction(c, c.eviction)
        due = w.shutting_down and w.deadline is not None and w.now >= w.deadline
        problem = kill_problem(
            c,
            self.event,
            busy=bool(replica.inflight),
            draining=replica.draining,
            retired=replica.retired,
            ttl_due=self.ttl_due(replica.model),
            abandoned=c.replica in self.abandoned,
            shutting_down=w.shutting_down,
            deadline_due=due,
        )
        if problem:
            self.fail("INV-CAUSE", problem)
        if replica.inflight:
            forced = isinstance(self.event, UnloadRequested) and self.event.force
            if not (forced or due or replica.hung):
                self.fail("INV-KILL-IDLE", f"{c} while requests {sorted(replica.inflight)} are in flight")
        if self.kill_expected == c.replica:
            self.kill_expected = None
        self.abandoned.discard(c.replica)
        replica.killed = True

    def dispatch(self, c: Dispatch) -> None:
        w = self.w
        request = w.requests.get(c.rid)
        if request is None or c.rid in w.dispatched or request.status != WAITING:
            self.fail("INV-NO-DOUBLE-DISPATCH", f"{c}: request is {request and request.status}")
            return
        replica = w.replicas.get(c.replica)
        if replica is None or c.model not in self.s.models:
            self.fail("INV-DISPATCH-READY", f"{c} names an unknown replica or model")
            return
        spec = replica.spec
        if w.shutting_down:
            self.fail("INV-SHUTDOWN", f"{c} after shutdown began")
        if replica.broke:
            self.fail("INV-BROKEN", f"{c} to a replica that broke off a reply: {replica}")
        if not replica.ready or not replica.live or replica.retired or replica.model != c.model:
            self.fail(
                "INV-DISPATCH-READY", f"{c} to a replica that is not ready to serve {c.model}: {replica}"
            )
        if c.model not in eligible(self.s, request.target, request.tokens):
            self.fail(
                "INV-DISPATCH-READY", f"{c}: {c.model} may not serve {request.target!r}/{request.tokens}"
            )
        if len(replica.inflight) >= spec.slots:
            self.fail(
                "INV-SLOTS", f"{c} to a replica with {len(replica.inflight)} of {spec.slots} slots busy"
            )
        free = w.free_replicas(c.model)
        if free and replica not in free:
            for inv in ("INV-AFFINITY-GUARD", "INV-LEAST-LOADED"):
                self.fail(inv, f"{c} to a replica without a free slot while {free[0].id} had one")
        elif free:
            for inv, message in choice_problems(free, replica, request.prefix, self.s.policy.affinity_guard):
                self.fail(inv, f"{c}: {message}")
        if request.target in self.s.pools:
            self.pool_priority(request, c)
        self.dispatches.append((request, c.model))
        self.left.append(request)
        w.dispatched.add(c.rid)
        w.last_used[c.model] = w.now
        request.status, request.put_back = RUNNING, False
        request.replica, request.model = c.replica, c.model
        replica.inflight.add(c.rid)
        remember(replica, request.prefix, self.s.policy)

    def pool_priority(self, request: RequestView, c: Dispatch) -> None:
        """A pooled request goes to the first member with a free slot, unless an earlier claim holds it."""
        w = self.w
        held: set[int] = set()
        for other in w.waiting():
            if other.order < request.order and w.claimed(other):
                for name in eligible(self.s, other.target, other.tokens):
                    if w.live_count(name) < self.s.models[name].replicas:
                        held.update(self.s.models[name].gpus)
        for name in eligible(self.s, request.target, request.tokens):
            if name == c.model:
                return
            if w.free_replicas(name) and not held.intersection(self.s.models[name].gpus):
                self.fail("INV-POOL-PRIORITY", f"{c} while higher-priority member {name} had a free slot")
                return
