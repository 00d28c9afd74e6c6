"""Ollama's descriptive calls: ``/api/tags`` (every name a client may use), ``/api/ps`` (what is loaded),
``/api/show`` (one model in detail) and ``/api/version``.

The details come from each model's GGUF header, read once per file version (its size and modification
time) in a worker thread: the architecture as ``family``, the parameter count as ``parameter_size``,
``general.file_type`` as ``quantization_level``, every scalar of the header as ``model_info``, the chat
template. ``digest`` is not the file's SHA-256 (hashing gigabytes on a listing would stall it): it is the
SHA-256 of the file's path, size and modification time, which changes whenever the file does. Pools and
aliases are entries of their own (a pool described by its first member; an alias marked ``alias_of``);
models of peer routers are listed with ``peer`` and without file details.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import gguf
import trio

from router.config.load import Config, resolve_name
from router.observe.capabilities import capabilities
from router.placement.gguf_header import GGUFError, read_header
from router.shell.views import RouterView
from router.version import package_version
from statemachine import ModelState, ReplicaPhase, queries

# The Ollama API level these calls follow (clients compare it to enable features such as tools, structured
# output and thinking).
OLLAMA_VERSION = "0.12.6"
_FOREVER = "2318-01-01T00:00:00Z"  # how Ollama writes "never expires"


@attrs.frozen
class Facts:
    """What a model's file says about it."""

    size: int
    modified: float
    digest: str
    family: str
    parameters: int
    quantization: str
    info: dict[str, Any]
    template: str
    fill_in_middle: bool


_facts: dict[tuple[str, int, float], Facts | None] = {}


def _read_facts(path: Path, size: int, modified: float) -> Facts | None:
    try:
        header = read_header(path)
    except (GGUFError, OSError):
        return None
    info = {k: v for k, v in header.metadata.items() if not isinstance(v, tuple)}
    parameters = sum(t.n_elements for t in header.tensors)
    info["general.parameter_count"] = parameters
    file_type = header.get("general.file_type")
    try:
        quantization = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        quantization = "unknown"
    template = header.get("tokenizer.chat_template", "")
    fim = any(f"tokenizer.ggml.{t}_token_id" in header.metadata for t in ("fim_pre", "prefix"))
    digest = hashlib.sha256(f"{path}\0{size}\0{modified}".encode()).hexdigest()
    return Facts(
        size=size,
        modified=modified,
        digest=digest,
        family=header.arch,
        parameters=parameters,
        quantization=quantization,
        info=info,
        template=template if isinstance(template, str) else "",
        fill_in_middle=fim,
    )


async def facts_of(path: Path) -> Facts | None:
    """The facts of the model file at ``path`` (None when it cannot be read as GGUF)."""
    try:
        stat = await trio.to_thread.run_sync(os.stat, path)
    except OSError:
        return None
    size = sum(_shard_sizes(path, stat.st_size))
    key = (str(path), size, stat.st_mtime)
    if key not in _facts:
        _facts[key] = await trio.to_thread.run_sync(_read_facts, path, size, stat.st_mtime)
    return _facts[key]


def _shard_sizes(path: Path, first: int) -> Iterator[int]:
    yield first
    match = path.name.rsplit("-00001-of-", 1)
    if len(match) != 2:
        return
    count = match[1].removesuffix(".gguf")
    for i in range(2, int(count) + 1 if count.isdigit() else 0):
        shard = path.with_name(f"{match[0]}-{i:05d}-of-{count}.gguf")
        if shard.is_file():
            yield shard.stat().st_size


def parameter_size(n: int) -> str:
    """A parameter count as Ollama shows it: 7.6B, 494M, 12K."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            shown = f"{n / scale:.1f}" if n < 10 * scale else f"{n / scale:.0f}"
            return shown + unit
    return str(n)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def details(facts: Facts | None) -> dict[str, Any]:
    if facts is None:
        return {"parent_model": "", "format": "gguf", "family": "", "families": None}
    return {
        "parent_model": "",
        "format": "gguf",
        "family": facts.family,
        "families": [facts.family],
        "parameter_size": parameter_size(facts.parameters),
        "quantization_level": facts.quantization,
    }


def described_model(config: Config, name: str) -> str | None:
    """The local model whose file describes ``name`` (a model, or a pool's first member); None: a peer's."""
    if name in config.models:
        return name
    pool = config.pools.get(name)
    if pool is not None:
        return next((m for m in pool.members if m in config.models), None)
    return None


def names(config: Config, view: RouterView) -> list[tuple[str, str]]:
    """(name a client may use, the model or pool it names): models, pools, then their aliases, then peers'."""
    out = [(n, n) for n in (*config.models, *config.pools)]
    out += [(alias, n) for n, m in (*config.models.items(), *config.pools.items()) for alias in m.aliases]
    local = {n for n, _ in out}
    peers = [n for n, spec in view.state.settings.models.items() if spec.remote and n not in local]
    out += [(n, n) for n in peers]
    out += [(alias, n) for alias, n in view.peer_aliases().items() if alias not in local]
    return out


async def tag_entry(config: Config, view: RouterView, name: str, target: str) -> dict[str, Any]:
    model = described_model(config, target)
    facts = None if model is None else await facts_of(config.models[model].path)
    entry: dict[str, Any] = {
        "name": name,
        "model": name,
        "modified_at": _iso(facts.modified if facts else time.time()),
        "size": facts.size if facts else 0,
        "digest": facts.digest if facts else hashlib.sha256(name.encode()).hexdigest(),
        "details": details(facts),
        "capabilities": _capabilities(config, target, facts),
    }
    if name != target:
        entry["alias_of"] = target
    if model is None and target not in config.pools:
        entry["peer"] = (
            view.state.settings.models[target].peer if target in view.state.settings.models else None
        )
    return entry


def _capabilities(config: Config, target: str, facts: Facts | None) -> list[str]:
    """Ollama's words for what ``target`` can do: completion, tools, insert, vision, embedding."""
    ours = capabilities(config, target)
    words = []
    if "chat" in ours or "completion" in ours:
        words.append("completion")
    if "tools" in ours:
        words.append("tools")
    if facts is not None and facts.fill_in_middle and "completion" in words:
        words.append("insert")
    words += [w for w in ("vision", "embedding") if w in ours]
    return words


def _loaded(view: RouterView, model: str) -> bool:
    return queries.model_state(view.state, model) in (ModelState.READY, ModelState.LOADING)


def _expires(view: RouterView, model: str) -> str:
    """When the model stops if nothing uses it (its keep_alive or ttl after its last use)."""
    state = view.state
    spec = state.settings.models[model]
    ttl = state.keep_alive.get(model, spec.ttl)
    if ttl is None or ttl == float("inf") or spec.pinned:
        return _FOREVER
    since = max(state.loaded_at.get(model, state.now), state.last_used.get(model, state.now))
    return _iso(time.time() + max(0.0, since + ttl - state.now))


async def ps_entries(config: Config, view: RouterView) -> list[dict[str, Any]]:
    """/api/ps: each local model with a replica loading or ready, its memory and its usable context."""
    out = []
    for model in config.models:
        if not _loaded(view, model):
            continue
        state = view.state
        replicas = [r for r in state.replicas if r.model == model and r.phase != ReplicaPhase.STOPPING]
        spec = state.settings.models[model]
        size = sum(spec.need_for(r.gpus, gpu) for r in replicas for gpu in r.gpus)
        entry = await tag_entry(config, view, model, model)
        del entry["modified_at"]
        entry.update(
            size=size,
            size_vram=size,
            expires_at=_expires(view, model),
            context_length=view.launches[model].ctx_per_slot,
        )
        out.append(entry)
    return out


async def show_document(config: Config, view: RouterView, name: str) -> tuple[str, dict[str, Any]] | None:
    """The model or pool ``name`` names and its /api/show document; None when it names none served here."""
    target = resolve_name(config, name)
    model = None if target is None else described_model(config, target)
    if target is None or model is None:
        return None
    facts = await facts_of(config.models[model].path)
    launch = view.launches[model]
    parameters = f"num_ctx {launch.ctx_per_slot}\nnum_parallel {config.models[model].parallel}"
    return target, {
        "license": "",
        "modelfile": f"# served by llama-router\nFROM {config.models[model].path}\n",
        "parameters": parameters,
        "template": facts.template if facts else "",
        "details": details(facts),
        "model_info": facts.info if facts else {},
        "capabilities": _capabilities(config, target, facts),
        "modified_at": _iso(facts.modified if facts else time.time()),
        "context_length": launch.ctx_per_slot,
    }


def version_document() -> dict[str, str]:
    return {"version": OLLAMA_VERSION, "llama_router": package_version()}
