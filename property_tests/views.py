"""What the environment knows of replicas and requests, rebuilt only from the events and the commands.

``ReplicaView`` and ``RequestView`` are the environment's record of one replica and one request; ``WorldView``
holds them all with the settings, the clock and the ages eviction reads, and answers what the trace checks
ask: what waits, what is resident where, what fits, what a pass would load and whom it would evict. Nothing
here calls into the scheduler's own helpers: the rules are written again, from spec/scheduler.md.
"""

from __future__ import annotations

import attrs

from statemachine import ModelSpec, Settings

WAITING = "waiting"
RUNNING = "running"
ORPHANED = "orphaned"  # its replica exited during this step; a Reject must follow
TERMINAL = ("finished", "rejected", "left", "closed")

Findings = dict[str, list[str]]


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
    broke: bool = False  # it broke off a reply: it takes no new work (INV-BROKEN)
    asked: bool = False  # started for no request (Startup, LoadRequested): never abandoned
    inflight: set[int] = attrs.Factory(set)
    memory: list[tuple[int, ...]] = attrs.Factory(list)  # prefix chains of its last dispatches, newest first

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
    prefix: tuple[int, ...] = ()


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
class WorldView:
    """Every replica and request the environment knows of, and the questions the trace checks ask of them."""

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
    # Models a load of which failed while another replica of them was live (until one is ready or none is).
    failing: set[str] = attrs.Factory(set)

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
            live = self.live_count(name)
            if live and name in self.failing:
                continue  # INV-FAILING: no new replica while the others of a failed load settle
            if live < self.settings.models[name].replicas:
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

    def abandoned(self, left: RequestView) -> set[int]:
        """The loading replicas that stop when ``left``, which waited, leaves (INV-ABANDON): of the models
        that may serve its target, those not pinned, with no waiting request and no replica asked for."""
        pool = self.settings.pools.get(left.target)
        if pool is None:
            names = [left.target]
        else:
            names = list(pool.members) if pool.fallback else list(pool.members[:1])
        out: set[int] = set()
        for name in names:
            spec = self.settings.models.get(name)
            replicas = [r for r in self.of_model(name) if not r.killed]
            if spec is None or spec.pinned or self.has_queued(name) or any(r.asked for r in replicas):
                continue
            out |= {r.id for r in replicas if r.loading}
        return out

    def claimed(self, request: RequestView) -> bool:
        return self.now >= request.arrived + self.settings.policy.claim_after

    def free_replicas(self, model: str) -> list[ReplicaView]:
        slots = self.settings.models[model].slots
        return [
            r
            for r in self.of_model(model)
            if r.ready and not r.killed and not r.draining and len(r.inflight) < slots
        ]
