"""Which replicas keep their prompt caches: the store's switches, where a new replica's slots go and what it
restores first, and which stops save first. The owner task (``router.shell.runtime``) asks; the saving and
restoring itself is ``router.shell.kv_slots``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from router.deploy.deployment import Deployment
from router.deploy.launch import ModelLaunch
from router.shell.kv_slots import SAVE_CAUSES
from router.shell.kv_store import KvStore, shelf_name
from router.shell.processes import KvLaunch
from router.shell.prompts import prompt_probe
from statemachine import KillCause, Replica

__all__ = ["kv_enabled", "kv_launch", "saves_before_stop"]

log = logging.getLogger("router")


def kv_enabled(deployment: Deployment, model: str) -> bool:
    """The store is on for ``model``: on for the router and the model, with room, and a binary that saves."""
    router = deployment.config.router
    spec = deployment.config.models.get(model)
    return (
        router.kv_store
        and router.kv_store_mib > 0
        and deployment.slot_saves
        and spec is not None
        and spec.kv_store
    )


def kv_launch(
    deployment: Deployment, store: KvStore, model: str, launch: ModelLaunch, body: Mapping[str, Any] | None
) -> KvLaunch | None:
    """Where a new replica of ``model`` saves its slots and what it restores first, given the body of the
    request that loads it (None: a load without a request); None when the store is off for it."""
    if not kv_enabled(deployment, model):
        return None
    router = deployment.config.router
    store.cap_bytes = router.kv_store_mib << 20
    try:
        shelf = store.shelf(shelf_name(model, launch.argv(0)))
    except OSError as exc:
        log.warning("no saved prompt caches for %s: %s", model, exc)
        return None
    probe = prompt_probe(body) if body is not None else None
    return KvLaunch(store, shelf, probe, router.kv_store_timeout)


def saves_before_stop(deployment: Deployment, replica: Replica | None, cause: KillCause) -> bool:
    """Whether a replica stopped for ``cause`` first saves its slots: an idle one whose model keeps its
    caches (a replica stopped with requests in flight is not idle, and one that failed or hung has nothing
    worth keeping)."""
    if cause not in SAVE_CAUSES or replica is None:
        return False
    return not replica.forced and kv_enabled(deployment, replica.model)
