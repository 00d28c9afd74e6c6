"""INV-EVICT-NEED and INV-VICTIM: the replicas an eviction kills are the ones the policy would choose from
the world's view (lru or fifo age, residents with queued work last), killed only when a waiting request needs
the room and may take it now; and a request that needs room the policy can make does not wait without it.
"""

from __future__ import annotations

from statemachine import Command, Eviction, Kill, ModelSpec

from .step_base import StepBase
from .views import RequestView, eligible


def _evicts_for(command: Command | None) -> str | None:
    """The model an eviction Kill makes room for; None for any other command."""
    if isinstance(command, Kill) and command.eviction is not None:
        return command.eviction.model
    return None


class EvictionChecks(StepBase):
    """Each run of eviction Kills against the victims the policy would pick, and evictions left undone."""

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
