"""Making room on GPUs: how many replicas of a model could ever run, and which residents leave for them."""

from __future__ import annotations

from collections import Counter

from .settings import ModelSpec
from .state import STOPPING, Request
from .swaps import young
from .work import Work


def loadable(w: Work, spec: ModelSpec, live: int, own: Counter[int] | None = None) -> int:
    """How many replicas beyond the ``live`` ones could run beside the pinned residents (up to the total);
    ``own``: the bytes the live ones hold on each GPU (None: each holds ``spec``'s need on every GPU)."""
    cap = w.policy.max_models_per_gpu
    best = spec.replicas - live
    for gpu in spec.gpus:
        pinned = [
            r
            for r in w.replicas.values()
            if gpu in r.gpus
            and r.model != spec.name
            and r.phase != STOPPING
            and not r.draining
            and w.is_pinned(r.model)
        ]
        if len({r.model for r in pinned}) + 1 > cap:
            return 0
        budget = w.settings.budget(gpu)
        need = spec.need_on(gpu)
        if budget is None or need == 0:
            continue
        mine = need * live if own is None else own[gpu]
        room = budget - sum(w.spec_of(r).need_for(r.gpus, gpu) for r in pinned) - mine
        best = min(best, max(room // need, 0))
    return best


def choose_victims(
    w: Work, request: Request | None, spec: ModelSpec, missing: int, protected: set[str], wake: list[float]
) -> list[str] | None:
    """Models to evict so that ``missing`` replicas of ``spec`` fit for ``request``; None when it cannot be
    done now (a resident too young to leave sets a wake-up for when it may). ``request`` None: for a load
    asked for, which no request has waited for."""
    victims: list[str] = []
    # Replicas that are stopping, or draining (unload, reload) and so about to stop, count as gone.
    leaving = {r.model for r in w.replicas.values() if r.phase == STOPPING or r.draining}
    gone = leaving - {r.model for r in w.replicas.values() if r.phase != STOPPING and not r.draining}
    for gpu in spec.gpus:
        if w.overcommitted(gpu):
            return None  # other processes took what its residents hold: no resident leaves for that
        while not w.fits(spec, gpu, missing, gone | set(victims), count_stopping=False):
            choices = {
                r.model
                for r in w.replicas.values()
                if gpu in r.gpus and r.phase != STOPPING and r.model != spec.name
            } - set(victims)
            choices = {m for m in choices if not w.is_pinned(m) and m not in protected}
            if choices:
                staying = young(w, request, gpu)
                if not choices - staying.keys():  # it waits: until they may leave, or until it has aged
                    wake.extend(t for m, t in staying.items() if m in choices and t is not None)
                    if request is not None:
                        wake.append(request.arrived + w.policy.max_wait[request.klass])
                choices -= staying.keys()
            if not choices:
                return None
            victims.append(min(choices, key=lambda m: victim_key(w, m)))
    return victims


def victim_key(w: Work, model: str) -> tuple[bool, float, str]:
    if w.policy.eviction == "fifo":
        age = w.loaded_at[model] if model in w.loaded_at else w.now  # noqa: SIM401 (evolver)
    else:
        age = w.last_use(model)
    return (w.has_queued(model), age, model)
