"""Reload the configuration (SIGHUP or POST /reload) without disturbing what did not change.

The new file is read and prepared completely first (validation, placement, the scheduler's settings, a
llama-server that takes every flag the router passes); any error leaves the old configuration serving and
is returned to the caller. A configuration made from a models folder scans the folder again: new files
become models, removed ones go like removed tables. On success, models whose replicas no longer match
(removed, or started with other flags, context, GPUs or slots) drain — in-flight requests finish — and
stop; models that did not change keep running and serving. Listening address, port and max_body_mib only
change with a restart.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import trio

from router.config.load import Config, ConfigError, load_config
from router.deploy.deployment import Deployment, changed_models, prepare
from router.deploy.launch import ModelLaunch
from router.hosts.locate import LlamaServerNotFound
from router.hosts.server_build import check_router_flags, flag_words
from router.shell.runtime import Router

log = logging.getLogger("router")


def router_flags(launch: ModelLaunch) -> tuple[str, ...]:
    """The flags the router itself puts on the command line of ``launch``'s replicas; the pass-through flags
    of [defaults] and the model's table are left out (``check_flags`` judges those, key by key)."""
    own = attrs.evolve(launch, defaults={}, model=attrs.evolve(launch.model, extra_args=()))
    return flag_words(own.argv(0)[1:])


def check_llama_servers(deployment: Deployment) -> None:
    """Refuse a llama-server binary of ``deployment`` that lacks a flag the router passes to its replicas
    (LlamaServerTooOld: one line naming the binary, its build and the oldest build supported), at start and
    on every reload. The build of each binary is read here, once, for /health and /status."""
    passed: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, launch in deployment.launches.items():
        passed.setdefault(launch.binary, {})[name] = router_flags(launch)
    for binary, flags in passed.items():
        check_router_flags(Path(binary), flags)


@attrs.frozen
class ReloadResult:
    ok: bool
    message: str
    restarted: tuple[str, ...] = ()


async def reload_config(router: Router, path: Path | None = None) -> ReloadResult:
    """Reload from ``path``, else from where the running configuration came from (its file, its models
    folder, or both: the folder is scanned again)."""
    if path is None and router.source is not None:
        source = router.source.describe()
        read = router.source.load
    else:
        file = path or router.config.path
        source = str(file)

        def read() -> Config:
            return load_config(file)

    try:
        config = await trio.to_thread.run_sync(read)
        deployment = await trio.to_thread.run_sync(prepare, config, router.gpus, router.our_pids())
        await trio.to_thread.run_sync(check_llama_servers, deployment)
    except (ConfigError, LlamaServerNotFound) as exc:
        log.error("reload refused, the old configuration keeps serving: %s", exc)
        return ReloadResult(False, str(exc))
    except OSError as exc:
        message = f"cannot read config {source}: {exc.strerror or exc}"
        log.error("reload refused, the old configuration keeps serving: %s", message)
        return ReloadResult(False, message)
    changed = changed_models(router.deployment, deployment)
    router.redeploy(deployment, changed)
    restarted = tuple(sorted(changed))
    log.info(
        "configuration reloaded from %s; draining and restarting: %s", source, ", ".join(restarted) or "none"
    )
    return ReloadResult(True, "reloaded", restarted)
