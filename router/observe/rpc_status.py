"""The ``rpc_devices`` section of /status: each RPC device, what holds it, and whether it answers.

``state`` is ``in_use`` while a replica holds the device (loading, serving or stopping), else what the last
connect probe found (``reachable``, ``unreachable``), or ``unknown`` before the first probe.
``reserved_bytes`` is what the scheduler counts against the budget (the whole device for each replica
on it: an rpc-server serves one client at a time); ``predicted_bytes`` the placement prediction of the
replicas on it (weights, KV cache and compute buffer of their share of the layers).
"""

from __future__ import annotations

from typing import Any

from router.deploy.rpc_devices import rpc_devices
from router.shell.rpc_probe import Endpoint
from router.shell.views import RouterView
from statemachine import queries, replica_state

__all__ = ["held_endpoints", "rpc_device_entries", "rpc_endpoints"]


def rpc_endpoints(view: RouterView) -> list[Endpoint]:
    """The (host, port) of every configured RPC device."""
    return [(d.host, d.port) for d in rpc_devices(view.config)]


def held_endpoints(view: RouterView) -> set[Endpoint]:
    """The endpoints of RPC devices some replica holds now."""
    held = {g for r in view.state.replicas for g in r.gpus}
    return {(d.host, d.port) for d in rpc_devices(view.config) if d.id in held}


def _predicted(view: RouterView, device: int, models: list[str]) -> int:
    need = {m["name"]: m.get("need_by_gpu", {}) for m in view.plan_document.get("models", [])}
    return sum(int(need.get(model, {}).get(str(device), 0)) for model in models)


def rpc_device_entries(view: RouterView) -> list[dict[str, Any]]:
    """One entry per configured RPC device, in file order."""
    state = view.state
    config = view.config
    entries = []
    for device in rpc_devices(config):
        holders = [r for r in state.replicas if device.id in r.gpus]
        result = view.rpc_result((device.host, device.port))
        if holders:
            status = "in_use"
        elif result is None:
            status = "unknown"
        else:
            status = "reachable" if result.reachable else "unreachable"
        entries.append(
            {
                "name": device.name,
                "endpoint": device.endpoint,
                "id": device.id,
                "state": status,
                "budget_bytes": state.settings.budget(device.id),
                "reserved_bytes": queries.used(state, device.id),
                "predicted_bytes": _predicted(view, device.id, [r.model for r in holders]),
                "residents": sorted(queries.residents(state, device.id)),
                "replicas": [{"id": r.id, "model": r.model, "state": replica_state(r)} for r in holders],
                "models": [m.name for m in config.models.values() if device.name in m.rpc],
                "probe": None
                if result is None
                else {
                    "reachable": result.reachable,
                    "checked_at": result.checked_at,
                    "connect_ms": result.connect_ms,
                    "error": result.error,
                },
            }
        )
    return entries
