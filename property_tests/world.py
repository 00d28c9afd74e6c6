"""The environment's view of the scheduler, rebuilt only from the events fed in and the commands out.

``World.apply(event, commands, state)`` replays one step as the router shell would see it: which replicas
were spawned, readied, killed and exited, which requests wait, run, finished or were turned away. While it
walks the commands it checks the trace properties of spec/scheduler.md and files every violation under its
spec id in the returned ``Findings``. It never calls into the scheduler's own helpers: the rules it checks
are written here again, from the spec.
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from statemachine import (
    ClientGone,
    Command,
    Dispatch,
    DispatchFailed,
    Event,
    Eviction,
    Kill,
    LoadFailed,
    ModelSpec,
    Reject,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Spawn,
    State,
    Stopped,
    Tick,
    UnloadRequested,
    WakeAt,
)
from statemachine.state import INFLIGHT, QUEUED

from .causes import kill_problem, spawn_problem

WAITING = "waiting"
RUNNING = "running"
ORPHANED = "orphaned"  # its replica exited during this step; a Reject must follow
TERMINAL = ("finished", "rejected", "left", "closed")

ANSWERS = {
    "queue_full": 503,
    "model_not_found": 404,
    "shutting_down": 503,
    "load_failed": 503,
    "replica_exited": 502,
    "model_unavailable": 503,
    "context_length_exceeded": 400,
}

Findings = dict[str, list[str]]


def _evicts_for(command: Command | None) -> str | None:
    """The model an eviction Kill makes room for; None for any other command."""
    if isinstance(command, Kill) and command.eviction is not None:
        return command.eviction.model
    return None


@attrs.define
class ReplicaView:
    id: int
    model: str
    gpus: tuple[int, ...]
    spec: ModelSpec  # the configured spec, or the one it keeps after a reload retired it
    ready: bool = False
    retired: bool = False
    killed: bool = False
    draining: bool = False
    hung: bool = False  # reported unresponsive: it goes at once, busy or not
    inflight: set[int] = attrs.Factory(set)

    @property
    def loading(self) -> bool:
        return not self.ready and not self.killed

    @property
    def live(self) -> bool:
        """Serves or will serve: not killed, not draining."""
        return not self.killed and not self.draining


@attrs.define
class RequestView:
    rid: int
    target: str
    tokens: int | None
    arrived: float
    order: int
    status: str = WAITING
    replica: int | None = None
    outcome: str | None = None
    put_back: bool = False  # waiting again after a DispatchFailed
    model: str | None = None  # the model it was dispatched to


def eligible(settings: Settings, target: str, tokens: int | None) -> list[str]:
    """The models that may serve a request for ``target``, in priority order (pools, context, refusal)."""
    pool = settings.pools.get(target)
    if pool is None:
        names = [target] if target in settings.models else []
    else:
        names = list(pool.members) if pool.fallback else list(pool.members[:1])
    out = []
    for name in names:
        spec = settings.models[name]
        if spec.refusal is not None:
            continue
        if tokens is not None and spec.ctx_per_slot is not None and tokens > spec.ctx_per_slot:
            continue
        out.append(name)
    return out


@attrs.define
class World:
    settings: Settings
    now: float = 0.0
    replicas: dict[int, ReplicaView] = attrs.Factory(dict)
    requests: dict[int, RequestView] = attrs.Factory(dict)
    arrivals: int = 0
    shutting_down: bool = False
    deadline: float | None = None
    stopped: bool = False
    wake: float | None = None
    dispatched: set[int] = attrs.Factory(set)
    spawned_ids: set[int] = attrs.Factory(set)
    last_used: dict[str, float] = attrs.Factory(dict)  # model -> its last dispatch or finish (lru age)
    loaded_at: dict[str, float] = attrs.Factory(dict)  # model -> when its residency began (fifo age, ttl)

    # --------------------------------------------------------------------------------------- queries
    def waiting(self) -> list[RequestView]:
        return sorted((r for r in self.requests.values() if r.status == WAITING), key=lambda r: r.order)

    def outstanding(self, *statuses: str) -> list[int]:
        return sorted(r.rid for r in self.requests.values() if r.status in statuses)

    def replicas_where(self, pred: object) -> list[int]:
        return sorted(r.id for r in self.replicas.values() if pred(r))  # type: ignore[operator]

    def of_model(self, model: str) -> list[ReplicaView]:
        return [r for r in self.replicas.values() if r.model == model]

    def live_count(self, model: str) -> int:
        return sum(1 for r in self.of_model(model) if r.live)

    def residents(self, gpu: int) -> set[str]:
        return {r.model for r in self.replicas.values() if gpu in r.gpus}

    def used(self, gpu: int) -> int:
        return sum(r.spec.need_on(gpu) for r in self.replicas.values() if gpu in r.gpus)

    def fits(self, spec: ModelSpec, gpu: int, extra: int, gone: set[str], count_killed: bool = True) -> bool:
        """Would ``extra`` more replicas of ``spec`` fit on ``gpu`` (cap and budget, equality fits) once the
        models in ``gone`` left, counting killed replicas that have not exited yet unless told not to?"""
        residents = {spec.name}
        used = spec.need_on(gpu) * extra
        for r in self.replicas.values():
            if gpu in r.gpus and r.model not in gone and (count_killed or not r.killed):
                residents.add(r.model)
                used += r.spec.need_on(gpu)
        budget = self.settings.budget(gpu)
        cap = self.settings.policy.max_models_per_gpu
        return len(residents) <= cap and (budget is None or used <= budget)

    def fits_one(self, model: str) -> bool:
        """Would one more replica of ``model`` fit beside everything resident now (cap and budget)?"""
        spec = self.settings.models[model]
        return all(self.fits(spec, gpu, 1, set()) for gpu in spec.gpus)

    def addable(self, model: str) -> int:
        """How many more replicas of ``model`` could ever run beside the pinned residents that stay."""
        spec = self.settings.models[model]
        cap = self.settings.policy.max_models_per_gpu
        live = self.live_count(model)
        best = spec.replicas - live
        for gpu in spec.gpus:
            pinned = [
                r
                for r in self.replicas.values()
                if gpu in r.gpus and r.model != model and r.live and r.spec.pinned
            ]
            if len({r.model for r in pinned}) + 1 > cap:
                return 0
            budget, need = self.settings.budget(gpu), spec.need_on(gpu)
            if budget is not None and need:
                room = budget - sum(r.spec.need_on(gpu) for r in pinned) - need * live
                best = min(best, max(room // need, 0))
        return max(best, 0)

    def load_plan(self, request: RequestView) -> tuple[str, int] | None:
        """The candidate the scheduler loads for ``request`` (first lacking replicas that could get one), and
        how many replicas of it."""
        for name in eligible(self.settings, request.target, request.tokens):
            if self.live_count(name) < self.settings.models[name].replicas:
                count = self.addable(name)
                if count:
                    return name, count
        return None

    def load_target(self, request: RequestView) -> str | None:
        plan = self.load_plan(request)
        return plan[0] if plan else None

    def heads(self) -> list[RequestView]:
        """The earliest waiting request of each target, in arrival order: the ones a pass places."""
        seen: set[str] = set()
        out = []
        for request in self.waiting():
            if request.target not in seen:
                seen.add(request.target)
                out.append(request)
        return out

    def has_queued(self, model: str, also: tuple[RequestView, ...] = ()) -> bool:
        """Requests wait for the model itself or for a pool it belongs to (counting ``also`` as waiting)."""
        pools = {p.name for p in self.settings.pools.values() if model in p.members}
        return any(r.target == model or r.target in pools for r in (*self.waiting(), *also))

    def age(self, model: str) -> float:
        """lru: its last dispatch or finish (else its load); fifo: when its residency began."""
        loaded = self.loaded_at.get(model, self.now)
        if self.settings.policy.eviction == "fifo":
            return loaded
        return self.last_used.get(model, loaded)

    def busy(self, model: str, also: tuple[RequestView, ...] = ()) -> bool:
        return self.has_queued(model, also) or any(r.inflight for r in self.of_model(model))

    def victims(
        self, spec: ModelSpec, count: int, protected: set[str], also: tuple[RequestView, ...] = ()
    ) -> list[str] | None:
        """The residents the policy evicts, GPU by GPU, until ``count`` replicas of ``spec`` fit (killed
        replicas and models that are all leaving not counted); None when no allowed choice is left."""
        staying = {r.model for r in self.replicas.values() if not r.killed and not r.draining}
        gone = {r.model for r in self.replicas.values() if r.killed or r.draining} - staying
        chosen: list[str] = []
        for gpu in spec.gpus:
            while not self.fits(spec, gpu, count, gone | set(chosen), count_killed=False):
                choices = [
                    m
                    for m in {r.model for r in self.replicas.values() if gpu in r.gpus and not r.killed}
                    if m != spec.name
                    and m not in chosen
                    and m not in protected
                    and not (m in self.settings.models and self.settings.models[m].pinned)
                ]
                if not choices:
                    return None
                chosen.append(min(choices, key=lambda m: (self.has_queued(m, also), self.age(m), m)))
        return chosen

    def claimed(self, request: RequestView) -> bool:
        return self.now >= request.arrived + self.settings.policy.claim_after

    def free_replicas(self, model: str) -> list[ReplicaView]:
        slots = self.settings.models[model].slots
        return [
            r
            for r in self.of_model(model)
            if r.ready and not r.killed and not r.draining and len(r.inflight) < slots
        ]

    # ----------------------------------------------------------------------------------------- apply
    def apply(self, event: Event, commands: tuple[Command, ...], state: State) -> Findings:
        """Account for one step; return the violations found, keyed by spec id."""
        return _Step(self, event, commands, state).run()


class _Step:
    """The checks of one step, in the order the commands came out."""

    def __init__(self, world: World, event: Event, commands: tuple[Command, ...], state: State) -> None:
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

    def refused_answer(self, request: RequestView) -> tuple[int, str]:
        """How a request put back by DispatchFailed must be answered when it cannot wait (INV-REDISPATCH)."""
        if self.w.shutting_down:
            return 503, "shutting_down"
        if request.target not in self.s.models and request.target not in self.s.pools:
            return 404, "model_not_found"
        return 503, "model_unavailable"

    def fail(self, inv: str, message: str) -> None:
        self.found[inv].append(message)

    def run(self) -> Findings:
        self.before_commands()
        for position, command in enumerate(self.commands):
            self.position = position
            self.command(command)
        self.after_commands()
        return dict(self.found)

    # ------------------------------------------------------------------------------- the event itself
    def before_commands(self) -> None:
        w, e = self.w, self.event
        if isinstance(e, Tick):
            w.now = e.now
        elif isinstance(e, RequestArrived):
            w.arrivals += 1
            request = RequestView(e.rid, e.target, e.tokens, w.now, w.arrivals)
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
            else:
                # The shell has closed the exchange: the slot is free in this very step (INV-CANCEL).
                self.free_slot(request)
                if request.model is not None:
                    w.last_used[request.model] = w.now
                self.end(request, "closed")
                self.gone_running = e.rid
        elif isinstance(e, RequestFinished):
            request = w.requests[e.rid]
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
            return
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
        w.spawned_ids.add(c.replica)
        w.loaded_at.setdefault(c.model, w.now)
        w.replicas[c.replica] = ReplicaView(c.replica, c.model, tuple(c.gpus), spec)
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
        replica.killed = True

    def eviction(self, c: Kill, eviction: Eviction) -> None:
        """INV-EVICT-NEED, INV-VICTIM: at the first Kill of a run of evictions for one model, work out from
        the world's view which replicas should go now, and compare with the whole run."""
        model = eviction.model
        previous = self.commands[self.position - 1] if self.position else None
        if _evicts_for(previous) == model:
            return  # checked with the first Kill of its run
        run: list[int] = []
        for command in self.commands[self.position :]:
            if not isinstance(command, Kill) or _evicts_for(command) != model:
                break
            run.append(command.replica)
        spec = self.s.models.get(model)
        where = ", ".join(map(str, eviction.gpus))
        if spec is None or eviction.policy != self.s.policy.eviction or eviction.gpus != spec.gpus:
            self.fail("INV-VICTIM", f"{c} names the wrong policy, model or GPUs")
            return
        expectations = self.expected_evictions(spec)
        if any(run == kills for kills, _ in expectations):
            return
        models = {self.w.replicas[rid].model for rid in run if rid in self.w.replicas}
        needed = [victims for _, victims in expectations if victims]
        if not needed:
            self.fail(
                "INV-EVICT-NEED",
                f"{c}: no waiting request may evict for {model} now (it fits, or an earlier claim holds "
                f"GPU {where}); the step kills {run}",
            )
        elif any(models == set(victims) for victims in needed):
            self.fail("INV-EVICT-NEED", f"{c}: kills {run} before the claim although a victim is busy")
        else:
            self.fail("INV-VICTIM", f"evictions for {model} kill {run} ({sorted(models)}), expected {needed}")

    def expected_evictions(self, spec: ModelSpec) -> list[tuple[list[int], list[str]]]:
        """For each waiting request the pass may be placing that loads ``spec`` and whose GPUs no earlier
        claim holds: (the replicas its swap kills now, its victims)."""
        w = self.w
        out: list[tuple[list[int], list[str]]] = []
        held: set[int] = set()
        protected = {n for q in self.unavailable for n in eligible(self.s, q.target, q.tokens)}
        spawned = {rid for rid, _ in self.spawns}
        for r in w.heads():
            if r is self.arrival and self.arrival_over_limit:
                continue  # an overflow request loads nothing and protects nothing
            protected.update(eligible(self.s, r.target, r.tokens))
            plan = w.load_plan(r)
            if plan is None or r.rid in spawned:
                continue
            gpus = set(self.s.models[plan[0]].gpus)
            if plan[0] == spec.name and not held & gpus:
                victims = w.victims(spec, plan[1], protected) or []
                kills: list[int] = []
                if w.claimed(r) or not any(w.busy(v) for v in victims):
                    kills = [
                        replica.id
                        for v in victims
                        for replica in sorted(w.of_model(v), key=lambda x: x.id)
                        if not replica.killed and not replica.inflight
                    ]
                out.append((kills, victims))
            if w.claimed(r):
                held |= gpus
        return out

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
        if free:
            best = min(free, key=lambda r: (len(r.inflight), r.id))
            if len(best.inflight) < len(replica.inflight) or (
                len(best.inflight) == len(replica.inflight) and best.id != replica.id
            ):
                self.fail("INV-LEAST-LOADED", f"{c} while replica {best.id} had fewer in flight")
        if request.target in self.s.pools:
            self.pool_priority(request, c)
        self.dispatches.append((request, c.model))
        self.left.append(request)
        w.dispatched.add(c.rid)
        w.last_used[c.model] = w.now
        request.status, request.put_back = RUNNING, False
        request.replica, request.model = c.replica, c.model
        replica.inflight.add(c.rid)

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

    def reject(self, c: Reject) -> None:
        request = self.w.requests.get(c.rid)
        if request is None:
            if self.arrival is None or c.rid != self.arrival.rid:
                self.fail("INV-CONSERVATION", f"{c} for a request that never arrived")
            return
        if ANSWERS.get(c.code) != c.status:
            self.fail("INV-ANSWER", f"{c}: {c.code} is answered with status {ANSWERS.get(c.code)}")
        if request.status == ORPHANED:
            if (c.status, c.code) != (502, "replica_exited"):
                self.fail("INV-CONSERVATION", f"{c}: a request whose replica exited ends with 502")
            self.end(request, "rejected")
            return
        if request.status != WAITING:
            self.fail("INV-CONSERVATION", f"{c} for a request that is {request.status}")
        if c.code in ("model_unavailable", "queue_full"):
            self.left.append(request)
        if c.code == "model_unavailable" and eligible(self.s, request.target, request.tokens):
            self.unservable(request, c)
        self.end(request, "rejected")
        request.outcome = c.code
        if request is self.arrival:
            self.admission(request, c)
        elif c.code == "queue_full":
            self.fail("INV-ADMISSION", f"{c} for a request that had already been admitted")
        else:
            self.answer(request, c)

    def unservable(self, request: RequestView, c: Reject) -> None:
        """INV-UNSERVABLE: 503 model_unavailable only when no candidate is live and none can get a replica."""
        self.unavailable.append(request)
        names = eligible(self.s, request.target, request.tokens)
        plan = self.w.load_plan(request)
        if plan is not None or any(self.w.live_count(n) for n in names):
            self.fail("INV-UNSERVABLE", f"{c} although {plan or names} could still serve it")

    def answer(self, request: RequestView, c: Reject) -> None:
        """INV-ANSWER: a waiting request is answered with the status and code its situation calls for."""
        e, w = self.event, self.w
        doomed = self.load_failure[1] if self.load_failure is not None else []
        if w.shutting_down:
            expected = (503, "shutting_down")
        elif (request.rid == self.refused and self.refused_answer(request)[0] == 404) or (
            isinstance(e, SettingsChanged) and request.rid in self.vanished
        ):
            expected = (404, "model_not_found")
        elif request.rid in doomed:
            expected = (503, "load_failed")
            assert self.load_failure is not None
            reason = e.reason if isinstance(e, LoadFailed | ReplicaExited) else ""
            if self.load_failure[0] not in c.message or reason not in c.message:
                self.fail("INV-ANSWER", f"{c} does not name {self.load_failure[0]} and the reason {reason!r}")
        else:
            expected = (503, "model_unavailable")
        if (c.status, c.code) != expected:
            self.fail("INV-ANSWER", f"{c} after {e}, expected {expected}")

    def admission(self, request: RequestView, c: Reject) -> None:
        s, w = self.s, self.w
        names = eligible(s, request.target, request.tokens)
        if w.shutting_down:
            expected: tuple[int, str] | None = (503, "shutting_down")
        elif request.target not in s.models and request.target not in s.pools:
            expected = (404, "model_not_found")
        elif not names:
            pool = s.pools.get(request.target)
            members = (
                [request.target] if pool is None else (pool.members if pool.fallback else pool.members[:1])
            )
            specs = [s.models[m] for m in members]
            if all(m.refusal is not None for m in specs):
                expected = (503, "model_unavailable")
            else:
                expected = (400, "context_length_exceeded")
                largest = max(m.ctx_per_slot or 0 for m in specs if m.refusal is None)
                if str(request.tokens) not in c.message or str(largest) not in c.message:
                    self.fail("INV-ADMISSION", f"{c} does not name {request.tokens} and {largest} tokens")
        else:
            expected = None
        if expected is not None:
            if (c.status, c.code) != expected:
                self.fail("INV-ADMISSION", f"{c}, expected {expected}")
        elif c.code == "queue_full":
            if not self.arrival_over_limit:
                self.fail("INV-ADMISSION", f"{c} although the queue had room")
        elif c.code != "model_unavailable":
            self.fail("INV-ADMISSION", f"{c} for a servable request")

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
            elif refused.outcome != self.refused_answer(refused)[1]:
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

    def missed_eviction(self, q: RequestView, spec: ModelSpec, count: int, protected: set[str]) -> None:
        """INV-EVICT-NEED, the other half: a head that needs room the policy can make, and may make now (it
        claims, or no victim is busy), has its victims' idle replicas killed in that step."""
        w = self.w
        for rid, model in self.spawns:
            later = w.requests.get(rid)
            if (
                later is not None
                and later.order > q.order
                and set(spec.gpus) & set(self.s.models[model].gpus)
            ):
                return  # a later request loaded a model there after q was placed: the residents changed
        also = tuple(r for r in self.left if r.order > q.order)  # still waiting when q was placed
        victims = w.victims(spec, count, protected, also)
        if not victims or not (w.claimed(q) or not any(w.busy(v, also) for v in victims)):
            return
        idle = [r.id for v in victims for r in w.of_model(v) if not r.killed and not r.inflight]
        if idle:
            self.fail(
                "INV-EVICT-NEED",
                f"request {q.rid} needs room for {spec.name}: {victims} {idle} were not evicted",
            )

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
