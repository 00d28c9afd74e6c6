"""The documents of /v1/models, /status, /health and /logs/{replica} (and its live follow), built from the
router's state."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from router.config.load import Config, resolve_name
from router.deploy.rpc_devices import is_rpc, local_gpus
from router.hosts.server_build import UNKNOWN_BUILD, known_build
from router.observe.capabilities import CAPABILITIES, capabilities
from router.observe.rpc_status import rpc_device_entries
from router.shell.child import describe_returncode
from router.shell.happenings import HappeningKind
from router.shell.logring import NOTE
from router.shell.views import RouterView
from router.version import package_version
from statemachine import ModelState, ReplicaPhase, Request, State, model_state, queries, replica_state

LOG_TAIL_BYTES = 1 << 20  # most of a replica's log file that /logs/{replica} sends

GIB = 1 << 30


def gpu_entry(view: RouterView, gpu: int) -> dict[str, Any]:
    """One GPU for /status: the scheduler's budget and predicted use, and the driver's latest reading."""
    state = view.state
    budget = state.settings.budget(gpu)
    measured = view.gpu_reading(gpu)
    entry: dict[str, Any] = {
        "id": gpu,
        "name": measured.reading.name if measured else None,
        "bus_id": measured.reading.bus_id if measured else None,
        "budget_bytes": budget,
        "used_bytes": queries.used(state, gpu),
        "residents": sorted(queries.residents(state, gpu)),
        "max_models": state.settings.policy.max_models_per_gpu,
        "measured": None,
        "others_beyond_budget_bytes": state.foreign.get(gpu, 0),
    }
    if measured is not None:
        entry["measured"] = {
            "total_bytes": measured.reading.total,
            "used_bytes": measured.reading.used,
            "foreign_bytes": measured.foreign,
            "ours_bytes": measured.ours,
            "available_bytes": measured.available,
            "method": measured.method,
        }
    beyond = state.foreign.get(gpu, 0)
    if beyond and budget is not None:
        room = budget - beyond - queries.used(state, gpu)
        entry["warning"] = f"other processes hold {beyond / GIB:.2f} GiB of GPU {gpu} beyond its budget: " + (
            f"loads needing more than {room / GIB:.2f} GiB there wait or go to another GPU"
            if room >= 0
            else "no load goes there until that memory is back (its residents stay)"
        )
    if budget is None:
        entry["warning"] = (
            f"the memory of GPU {gpu} cannot be read and is not declared: models on it run with every layer "
            f"offloaded and ctx_default; set [devices.{gpu}] memory_mib to plan against its real size"
        )
    return entry


def model_entry(config: Config, view: RouterView, name: str, created: int) -> dict[str, Any]:
    """One model of /v1/models (and GET /v1/models/{id})."""
    state = view.state
    model = config.models[name]
    launch = view.launches[name]
    entry: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "llama-router",
        "state": model_state(state, name),
        "status": load_status(view, name),
        "gpus": list(local_gpus(state.settings.models[name].gpus)),
        "aliases": list(model.aliases),
        "parallel": model.parallel,
        "ctx": launch.ctx,
        # What a router that peers with this one reads: capacity (slots over every replica) and context.
        "slots": model.parallel * model.num_instance,
        "ctx_per_slot": launch.ctx_per_slot,
        **context_fields(launch.ctx_per_slot),
        "capabilities": capabilities(config, name),
    }
    if model.rpc:
        entry["rpc_devices"] = list(model.rpc)
    if model.pricing is not None:
        entry["pricing"] = {k: v for k, v in attrs.asdict(model.pricing).items() if v is not None}
    if model.reasoning_effort is not None:
        effort = attrs.asdict(model.reasoning_effort)
        if effort["disable"] is None:
            del effort["disable"]
        entry["reasoning_effort"] = effort
    return entry


def context_fields(per_slot: int | None) -> dict[str, int | None]:
    """A request's usable context (a slot's), under its own name and the name LM Studio's model list uses."""
    return {"context_length": per_slot, "max_context_length": per_slot}


# llama-server's router mode says whether a model is "loaded", "loading" or "unloaded"; a model that is
# stopping takes no new request (the next one loads it again), so it counts as unloaded.
LOAD_STATUS = {
    ModelState.READY: "loaded",
    ModelState.LOADING: "loading",
    ModelState.STOPPING: "unloaded",
    ModelState.UNLOADED: "unloaded",
}
_LOAD_ENDS = frozenset(
    {HappeningKind.READY, HappeningKind.LOAD_FAILED, HappeningKind.LOAD_REFUSED, HappeningKind.LOAD}
)
_LOAD_FAILURES = frozenset({HappeningKind.LOAD_FAILED, HappeningKind.LOAD_REFUSED})


def load_status(view: RouterView, name: str) -> dict[str, Any]:
    """A local model's load status in the shape of llama-server's router mode: ``value`` (loaded, loading or
    unloaded), and ``failed`` when it is unloaded because its last load failed (or was refused)."""
    value = LOAD_STATUS[model_state(view.state, name)]
    status: dict[str, Any] = {"value": value}
    if value == "unloaded" and _last_load_failed(view, name):
        status["failed"] = True
    return status


def _last_load_failed(view: RouterView, name: str) -> bool:
    for happening in reversed(tuple(view.happenings())):
        if happening.model == name and happening.kind in _LOAD_ENDS:
            return happening.kind in _LOAD_FAILURES
    return False


def peer_model_entry(view: RouterView, name: str, created: int) -> dict[str, Any]:
    """One model a peer serves, for /v1/models: ``peer`` says where it lives."""
    spec = view.state.settings.models[name]
    peer = spec.peer
    assert peer is not None
    aliases = [alias for alias, model in view.peer_aliases().items() if model == name]
    down = peer in view.state.peers_down
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "llama-router",
        "peer": peer,
        "state": "unavailable" if down else "ready",
        "status": {"value": "unloaded" if down else "loaded"},
        "aliases": aliases,
        "ctx_per_slot": spec.ctx_per_slot,
        **context_fields(spec.ctx_per_slot),
        "capabilities": list(view.peer_capabilities(name)),
    }


def peer_model_names(view: RouterView) -> list[str]:
    return [name for name, spec in view.state.settings.models.items() if spec.remote]


def pool_entry(config: Config, view: RouterView, name: str, created: int) -> dict[str, Any]:
    """One pool of /v1/models (and GET /v1/models/{id}): its context is its smallest member's (a request
    may land on any), its capabilities those of any member."""
    pool = config.pools[name]
    states = {model_state(view.state, m) for m in pool.members}
    ready = ModelState.READY in states
    value = "loaded" if ready else "loading" if ModelState.LOADING in states else "unloaded"
    contexts = [c for m in pool.members if (c := _member_context(view, m)) is not None]
    found = set(capabilities(config, name))
    for member in pool.members:
        if member not in config.models:
            found |= set(view.peer_capabilities(member))
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "llama-router",
        "pool": list(pool.members),
        "fallback": pool.fallback,
        "aliases": list(pool.aliases),
        "state": "ready" if ready else "unloaded",
        "status": {"value": value},
        **context_fields(min(contexts) if contexts else None),
        "capabilities": [word for word in CAPABILITIES if word in found],
    }


def _member_context(view: RouterView, member: str) -> int | None:
    launch = view.launches.get(member)
    if launch is not None:
        return launch.ctx_per_slot
    spec = view.state.settings.models.get(member)
    return spec.ctx_per_slot if spec is not None else None


def alias_entry(entry: dict[str, Any], alias: str) -> dict[str, Any]:
    """The entry of ``alias``, a name of the model or pool of ``entry``: the same description under the
    alias's ``id``, with ``alias_of`` naming the model and without ``slots`` (so that a router reading
    this list counts each model's capacity once) or a list of aliases of its own."""
    out = {key: value for key, value in entry.items() if key not in ("slots", "aliases")}
    out["id"] = alias
    out["alias_of"] = entry["id"]
    return out


def with_aliases(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """``entry`` followed by the entry of each of its aliases."""
    return [entry, *(alias_entry(entry, alias) for alias in entry.get("aliases", ()))]


def models_document(config: Config, view: RouterView) -> dict[str, Any]:
    """/v1/models: each model, pool and peer's model, each followed by one entry per alias."""
    created = int(time.time())
    entries = [model_entry(config, view, name, created) for name in config.models]
    entries += [pool_entry(config, view, name, created) for name in config.pools]
    entries += [peer_model_entry(view, name, created) for name in peer_model_names(view)]
    return {"object": "list", "data": [one for entry in entries for one in with_aliases(entry)]}


def named_entry(config: Config, view: RouterView, name: str) -> dict[str, Any] | None:
    """The /v1/models entry of the model or pool named ``name``, or the alias entry when ``name`` is one
    of its aliases; None when unknown."""
    target = resolve_name(config, name)
    created = int(time.time())
    if target is None:
        remote = view.peer_model(name)
        if remote is None:
            return None
        entry = peer_model_entry(view, remote, created)
    elif target in config.models:
        entry = model_entry(config, view, target, created)
    else:
        entry = pool_entry(config, view, target, created)
    return entry if entry["id"] == name else alias_entry(entry, name)


def capacity_entry(state: State, model: str) -> dict[str, Any]:
    """What one model can take and holds now: its slots (``slots_per_replica`` times at most ``replicas``
    replicas), its replicas by phase, and the requests in flight on them (a pool member in /status, a model
    in /props)."""
    spec = state.settings.models.get(model)
    if spec is None or spec.peer is not None:
        return _remote_capacity(state, model, None if spec is None else spec.peer)
    reps = queries.replicas_of(state, model)
    return {
        "model": model,
        "gpus": list(spec.gpus),
        "slots": spec.slots * spec.replicas,
        "slots_per_replica": spec.slots,
        "replicas": spec.replicas,
        "replicas_ready": sum(1 for r in reps if r.phase == ReplicaPhase.READY),
        "replicas_loading": sum(1 for r in reps if r.phase == ReplicaPhase.LOADING),
        "ctx_per_slot": spec.ctx_per_slot,
        "in_flight": sum(len(r.inflight) for r in reps),
        "state": model_state(state, model),
    }


def _remote_capacity(state: State, model: str, peer: str | None) -> dict[str, Any]:
    """A pool member a peer serves (``peer`` None: no peer has listed it yet)."""
    phase = "unknown" if peer is None else "unavailable" if peer in state.peers_down else "ready"
    return {
        "model": model,
        "peer": peer,
        "gpus": [],
        "slots": None if peer is None else state.settings.peer_limit(peer),
        "slots_per_replica": None,
        "replicas": 0,
        "replicas_ready": 0,
        "replicas_loading": 0,
        "ctx_per_slot": None,
        "in_flight": 0 if peer is None else len(state.peer_inflight.get(peer, ())),
        "state": phase,
    }


def queue_entry(request: Request, now: float) -> dict[str, Any]:
    """A waiting request as /status and the dashboard show it: its target, age, tokens, key and class."""
    return {
        "id": request.rid,
        "target": request.target,
        "age_s": round(now - request.arrived, 3),
        "tokens": request.tokens,
        "key": request.key or None,
        "class": request.klass.label,
    }


def waiting_for(state: State, target: str) -> int:
    """Requests queued for ``target`` (a model or a pool) by its own name."""
    fifo = state.queues.get(target)
    return fifo.count if fifo else 0


def llama_server_entries(view: RouterView) -> list[dict[str, Any]]:
    """Each llama-server binary the local models run (today the one of ``[router] llama_server``): its
    path, its llama.cpp build and commit (null: unknown) and its models. The builds are the readings made
    at start and on reload: nothing is run here."""
    models: dict[str, list[str]] = {}
    for name, launch in view.launches.items():
        models.setdefault(launch.binary, []).append(name)
    return [
        {"path": binary, **(known_build(binary) or UNKNOWN_BUILD).as_json(), "models": names}
        for binary, names in models.items()
    ]


def health_document(view: RouterView) -> dict[str, Any]:
    """/health: ok, the router's version and the build of each llama-server binary in use (no paths: the
    route is open without an API key)."""
    builds = [{"build": e["build"], "commit": e["commit"]} for e in llama_server_entries(view)]
    return {"status": "ok", "version": package_version(), "llama_server": builds}


def status_document(config: Config, view: RouterView) -> dict[str, Any]:
    state = view.state
    now = max(state.now, trio.current_time())  # the scheduler's clock only moves with events
    waiting = queries.queued(state)
    replicas = []
    for r in state.replicas:
        info = view.replica_info(r.id)
        progress = view.load_progress(r.id)
        replicas.append(
            {
                "id": r.id,
                "model": r.model,
                "gpus": list(local_gpus(r.gpus)),
                "rpc_devices": list(config.models[r.model].rpc) if r.model in config.models else [],
                "state": replica_state(r),
                "load": progress.document() if progress is not None else None,
                "in_flight": len(r.inflight),
                "slots": state.settings.models[r.model].slots,
                "port": view.ports.get(r.id) or (info.port if info else None),
                "pid": info.pid if info else None,
                "started_at": info.started_at if info else None,
                "log_path": info.log_path if info else None,
                "log_url": f"/logs/{r.id}",
            }
        )
    gpus = [gpu_entry(view, gpu) for gpu in sorted(state.settings.devices) if not is_rpc(gpu)]
    pools = [
        {
            "name": name,
            "fallback": pool.fallback,
            "members": [capacity_entry(state, member) for member in pool.members],
            "waiting": waiting_for(state, name),
        }
        for name, pool in config.pools.items()
    ]
    return {
        "version": package_version(),
        "llama_server": llama_server_entries(view),
        "queue": [queue_entry(q, now) for q in waiting],
        "gpus": gpus,
        "rpc_devices": rpc_device_entries(view),
        "replicas": replicas,
        "pools": pools,
        "peers": peers_entry(view),
        "recent": [attrs.asdict(h) for h in reversed(tuple(view.happenings()))],
        "shutting_down": state.shutting_down,
    }


def peers_entry(view: RouterView) -> list[dict[str, Any]]:
    """Each peer: its URL, up or down and why, its models, and what is forwarded to it now."""
    state = view.state
    out = []
    for entry in view.peer_entries():
        name = entry["name"]
        entry["in_flight"] = len(state.peer_inflight.get(name, ()))
        entry["max_in_flight"] = state.settings.peer_limit(name)
        if name in state.peers_down and entry["state"] != "down":
            entry["state"], entry["reason"] = "down", state.peers_down[name]
        out.append(entry)
    return out


async def replica_log(view: RouterView, replica: int, lines: int | None) -> tuple[str, str] | None:
    """The output of a replica (running, or exited a short while ago) and where it came from: the tail of
    its log file (``"file"``), else the lines kept in memory (``"memory"``); None for an unknown replica.
    ``lines`` keeps only that many last lines."""
    if view.replica_info(replica) is None:
        return None
    file = view.replica_log_file(replica)
    text = None if file is None else await trio.to_thread.run_sync(file.read_tail, LOG_TAIL_BYTES)
    source = "file"
    if text is None:
        text = "".join(line + "\n" for line in view.replica_log_lines(replica))
        source = "memory"
    if lines is not None:
        text = "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""
    return text, source


def _tail_lines(text: str, lines: int | None) -> list[str]:
    kept = text.splitlines()
    if lines is not None:
        kept = kept[-lines:] if lines > 0 else []
    return kept


def follow_replica_log(
    view: RouterView, replica: int, lines: int | None, *, quiet: float = math.inf
) -> AsyncIterator[str | None] | None:
    """The output of a replica as it comes: the tail ``replica_log`` sends (``lines`` of it), then each new
    line as the replica writes it, ending once the replica has exited and its last lines are sent (the last
    line says so, with the reason); None (the item) after each ``quiet`` seconds without a line. None for an
    unknown replica. A reader that stops reading (its client went away) stops following at once: the feed
    drops it as the generator is closed."""
    if view.replica_info(replica) is None:
        return None
    return _follow(view, replica, lines, quiet)


async def _follow(
    view: RouterView, replica: int, lines: int | None, quiet: float
) -> AsyncIterator[str | None]:
    file = view.replica_log_file(replica)
    if file is None:
        for line in _tail_lines("".join(f"{line}\n" for line in view.replica_log_lines(replica)), lines):
            yield line
        info = view.replica_info(replica)
        if info is not None and info.exited:
            why = f": {info.stop_reason}" if info.stop_reason else ""
            yield f"{NOTE}replica {replica} exited ({describe_returncode(info.returncode)}){why}"
        else:
            yield (
                f"{NOTE}replica {replica} has no log file (its directory, [router] replica_logs, cannot be "
                "written): these are the lines kept in memory, and new ones cannot be followed"
            )
        return
    with file.feed.follow() as follower:
        mark = file.mark()
        text = await trio.to_thread.run_sync(file.read_tail, LOG_TAIL_BYTES, mark)
        if text is None:
            text = "".join(f"{line}\n" for line in view.replica_log_lines(replica))
        for line in _tail_lines(text, lines):
            yield line
        while (batch := await follower.next_lines(quiet)) is not None:
            if not batch:
                yield None
            for line in batch:
                yield line
    info = view.replica_info(replica)
    if info is not None and not info.exited:
        # The file was closed while the replica runs (it could not be written any more).
        yield f"{NOTE}replica {replica}'s log file can no longer be written: following ends here"
