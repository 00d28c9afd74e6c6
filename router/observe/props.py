"""The document of GET /props: what the router serves and how much it can take, at a glance.

Every configured model with its capacity (slots per replica, replicas, the requests in flight on them and
those waiting for it by name, and how far its loading replicas have come) and its request filters (the
body fields its ``set_params`` forces and its ``strip_params`` removes), every pool with its members in
priority order, the members that may serve it (all with ``fallback``, else the first) and the requests sent
to it by name that are in flight or waiting, and the totals with the limits that bound waiting. The figures
are the ones /status shows (:func:`router.observe.status.capacity_entry`); /status adds the queue, GPUs,
replicas and recent events.
"""

from __future__ import annotations

from typing import Any

from router.config.load import Config
from router.config.model_extras import thawed_json
from router.config.values import ModelConfig
from router.observe.status import capacity_entry, waiting_for
from router.shell.views import RouterView
from statemachine import RequestPhase, queries, serving_models


def loads_of(view: RouterView, model: str) -> list[dict[str, Any]]:
    """How far each loading replica of ``model`` has come."""
    loads = []
    for replica in queries.replicas_of(view.state, model):
        progress = view.load_progress(replica.id)
        if progress is not None:
            loads.append({"replica": replica.id, **progress.document()})
    return loads


def filters_entry(model: ModelConfig) -> dict[str, Any]:
    """The body fields the model's requests get forced (``set_params``) and lose (``strip_params``)."""
    return {"set_params": thawed_json(model.set_params), "strip_params": list(model.strip_params)}


def props_document(config: Config, view: RouterView) -> dict[str, Any]:
    state = view.state
    settings = state.settings
    models = []
    for name in config.models:
        entry = capacity_entry(state, name)
        models.append(
            {
                "id": name,
                "aliases": list(config.models[name].aliases),
                "filters": filters_entry(config.models[name]),
                **{k: v for k, v in entry.items() if k != "model"},
                "waiting": waiting_for(state, name),
                "loading": loads_of(view, name),
            }
        )
    sent = [r for r in state.requests.values() if r.phase == RequestPhase.INFLIGHT]
    pools = []
    for name, pool in config.pools.items():
        members = [
            {"priority": rank, **capacity_entry(state, member)} for rank, member in enumerate(pool.members)
        ]
        serving = serving_models(settings, name)
        pools.append(
            {
                "id": name,
                "aliases": list(pool.aliases),
                "fallback": pool.fallback,
                "members": members,
                "serving": list(serving),
                "slots": sum(m["slots"] for m in members if m["model"] in serving),
                "in_flight": sum(1 for r in sent if r.target == name),
                "waiting": waiting_for(state, name),
            }
        )
    policy = settings.policy
    return {
        "object": "router.props",
        "models": models,
        "pools": pools,
        "in_flight": sum(len(r.inflight) for r in state.replicas),
        "waiting": len(queries.queued(state)),
        "queue_limit": policy.queue_limit,
        "routing_queue_limit": policy.routing_queue_limit,
        "max_models_per_gpu": policy.max_models_per_gpu,
        "default_pool": config.router.default_pool,
        "shutting_down": state.shutting_down,
    }
