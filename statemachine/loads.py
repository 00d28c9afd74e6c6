"""Loads that no single request drives (spec §4c, INV-LOAD-ASKED, INV-ABANDON).

- Asked for: ``LoadRequested`` (``POST /models/load``, ``preload``) puts a model in ``wanted``. After the
  waiting requests have been placed, each wanted model in the order asked gets its missing replicas as soon
  as they fit; otherwise idle residents that no waiting request needs and that are not loading are evicted
  for it, as the policy chooses them. The GPUs of requests that wait for a load are left alone, so an asked
  load never overtakes a request waiting for its swap, and a model that requests wait for is loaded by their
  rules (batching, hold) alone. Once its replicas have started the model leaves ``wanted``; those replicas
  are ``asked``.
- Abandoned: when a waiting request leaves (``ClientGone``), a replica still loading for it is stopped at once
  unless something else needs its model: another waiting request (for it or a pool it belongs to), a pin, or
  an ask (an ``asked`` replica, or the model in ``wanted``). Its GPUs go to the next waiter.
"""

from __future__ import annotations

from .commands import Eviction, KillCause
from .placement import placed_load, spawn_fitting
from .queries import serving_models
from .room import choose_victims
from .state import LOADING, STOPPING, Request
from .work import Work


def load_wanted(w: Work, reserved: set[int], protected: set[str], wake: list[float]) -> None:
    """Start what the wanted models lack, or make room for it (see the module). ``reserved``: the GPUs of the
    requests that wait for a load."""
    for name in list(w.wanted):
        spec = w.models.get(name)
        if spec is None:
            w.wanted.remove(name)  # a reload removed it
            continue
        live = len(w.live_replicas(name))
        if live >= spec.replicas or (live and name in w.failing):
            w.wanted.remove(name)  # started already, or settling after a failure
            continue
        loading = {r.model for r in w.replicas.values() if r.phase == LOADING}  # a load is never cut short
        load = placed_load(w, spec, live, reserved, protected | loading)
        if load is None:
            w.wanted.remove(name)  # pinned models leave it no room: it can never load
            continue
        spec, count = load
        if reserved.intersection(spec.gpus) or w.has_queued(name):
            continue  # requests wait for a load there, or for this model: theirs go first
        if all(w.fits(spec, g, count, set(), count_stopping=True) for g in spec.gpus):
            spawn_fitting(w, w.model(name), reserved, "load requested", None)
            w.wanted.remove(name)
            continue
        victims = choose_victims(w, None, spec, count, protected | loading, wake)
        if not victims or any(r.inflight for v in victims for r in w.replicas_of(v)):
            continue  # it waits for room: busy residents are never stopped for a load asked for
        where = ", ".join(str(g) for g in spec.gpus)
        eviction = Eviction(name, spec.gpus, w.policy.eviction)
        for victim in victims:
            for replica in w.replicas_of(victim):
                w.kill(
                    replica,
                    f"evicted ({w.policy.eviction}) to load '{name}' on GPU {where}",
                    KillCause.EVICTED,
                    eviction,
                )


def abandon(w: Work, request: Request) -> None:
    """``request`` left while it waited: stop the loads nothing else needs any more."""
    for name in serving_models(w.settings, request.target):
        spec = w.models.get(name)
        if spec is None or spec.pinned or name in w.wanted or w.has_queued(name):
            continue
        replicas = [r for r in w.replicas_of(name) if r.phase != STOPPING]
        if any(r.asked for r in replicas):
            continue
        for replica in replicas:
            if replica.phase == LOADING:
                w.kill(replica, "abandoned: every request waiting for it left", KillCause.ABANDONED)
