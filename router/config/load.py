"""Loading the configuration: TOML or JSON → frozen, validated values (router.config.values).

``load_config(path)`` reads the file (``.json`` → JSON, anything else → TOML) and applies the environment
overrides ROUTER_HOST, ROUTER_PORT, ROUTER_API_KEYS, ROUTER_CORS_ORIGINS, ROUTER_ALLOWED_HOSTS and
HISTORY_DB_PATH (an empty variable counts as unset). A config.json of the original llama-router (with its
presets.ini) is translated first (``router.config.original``); its errors name the original file and key.
``config_from_dict`` validates an already parsed document. Every problem raises :class:`ConfigError`, whose
message names the file, the dotted key, the bad value and what is allowed. Model files are not checked for
existence here: ``check_model_files`` does that when the configuration is deployed (at startup and on every
reload).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from router.config.key_table import check_plain_keys, parse_keys, scope_names
from router.config.keyspec import STRING_LIST, InvalidValue, KeySpec, check_value, render_value, spec_by_name
from router.config.original import Translation, is_original, presets_file, translate
from router.config.origins import (
    canonical_host_entry,
    canonical_origin_entry,
    host_entry_problem,
    origin_entry_problem,
)
from router.config.peer_table import parse_peer, remote_names
from router.config.reference import reference_markdown
from router.config.rpc_devices import check_model_rpc, parse_rpc_devices
from router.config.schema import ROUTER_KEYS, TOP_LEVEL_KEYS
from router.config.tables import (
    Doc,
    check_unique_names,
    parse_devices,
    parse_flags,
    parse_model,
    parse_model_defaults,
    parse_pool,
    secret_key,
)
from router.config.values import (
    ALL_GPUS,
    ANY_GPUS,
    Config,
    ConfigError,
    DeviceConfig,
    FlagValue,
    FrozenMap,
    GpuSelection,
    KeyConfig,
    ModelConfig,
    PoolConfig,
    Pricing,
    ReasoningEffort,
    RouterSettings,
    RpcDeviceConfig,
)

__all__ = [
    "ALL_GPUS",
    "ANY_GPUS",
    "Config",
    "ConfigError",
    "DeviceConfig",
    "FlagValue",
    "FrozenMap",
    "GpuSelection",
    "KeyConfig",
    "ModelConfig",
    "PoolConfig",
    "Pricing",
    "ReasoningEffort",
    "RouterSettings",
    "RpcDeviceConfig",
    "check_gpu_ids",
    "check_model_files",
    "config_dir",
    "config_from_dict",
    "default_history_db",
    "default_state_dir",
    "load_config",
    "read_api_keys",
    "read_config_document",
    "read_document",
    "reference_markdown",
    "resolve_gpus",
    "resolve_name",
    "validated",
]

log = logging.getLogger("router")
# Ignored keys of original configurations already reported by this process (reloads do not repeat them).
_reported: set[tuple[str, str, str]] = set()


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/llama-router, else $HOME/.local/state/llama-router."""
    env = os.environ if env is None else env
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]).expanduser() / "llama-router"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".local" / "state" / "llama-router"


def default_history_db(config_path: str | Path, env: Mapping[str, str] | None = None) -> Path:
    """The history database of a router run on ``config_path`` when ``history_db`` is not set:
    ``<state dir>/<config file stem>-<8 hex digits of the hash of its absolute path>/history.db``, so that
    routers on different config files never share one."""
    resolved = Path(config_path).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode("utf-8")).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", resolved.stem).strip(".") or "config"
    return default_state_dir(env) / f"{stem}-{digest}" / "history.db"


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, parse and validate a config file; ``env`` (default os.environ) supplies the overrides."""
    path = Path(path)
    env = os.environ if env is None else env
    data, translation = read_config_document(path, env)
    return validated(data, path, env=env, base_dir=path.absolute().parent, translation=translation)


def read_config_document(path: Path, env: Mapping[str, str]) -> tuple[Any, Translation | None]:
    """The document of a config file, translated when it is an original config.json (whose presets file
    ``env`` may name); its ignored keys are logged the first time this process reads them."""
    data = read_document(path)
    if not is_original(data):
        return data, None
    translation = translate(path, data, presets_file(path, env))
    for note in translation.ignored():
        seen = (str(note.origin.file), note.origin.key, note.text)
        if seen not in _reported:
            _reported.add(seen)
            log.warning("%s: %s is ignored: %s", note.origin.file, note.origin.key, note.text)
    return translation.document, translation


def validated(
    data: Any,
    path: Path,
    *,
    env: Mapping[str, str],
    base_dir: Path,
    translation: Translation | None = None,
) -> Config:
    """:func:`config_from_dict`, whose errors name the original file and key for a translated document."""
    try:
        return config_from_dict(data, path, env=env, base_dir=base_dir)
    except ConfigError as exc:
        if translation is None:
            raise
        raise translation.explain(exc) from None


def read_document(path: Path) -> Any:
    """The parsed document of a config file (``.json``: JSON, else TOML), not validated yet."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(path, f"cannot read the file: {exc.strerror or exc}") from None
    data: Any
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(path, f"not valid JSON: {exc}") from None
    else:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(path, f"not valid TOML: {exc}") from None
    return data


def config_from_dict(
    data: Mapping[str, Any],
    path_for_messages: str | Path = "<config>",
    *,
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> Config:
    """Validate a parsed document. ``env`` None means no environment overrides at all (handy in tests),
    nor variables for ``[keys.NAME] key_env``; ``base_dir`` None keeps relative paths as written."""
    doc = Doc(path_for_messages, base_dir)
    env = {} if env is None else env
    if not isinstance(data, Mapping):
        raise ConfigError(path_for_messages, "the document must be a table (a JSON object) at the top level")
    for key, value in data.items():
        if key not in TOP_LEVEL_KEYS:
            raise doc.unknown(str(key), value, TOP_LEVEL_KEYS)
    router = _router(doc, doc.table("router", data.get("router")), env)
    devices = parse_devices(doc, doc.table("devices", data.get("devices")), router.num_gpus)
    rpc_devices = parse_rpc_devices(
        doc, doc.table("rpc_devices", data.get("rpc_devices")), allow_public=router.allow_public_rpc
    )
    model_defaults, default_flags = parse_model_defaults(doc, doc.table("defaults", data.get("defaults")))
    defaults = parse_flags(doc, "defaults", default_flags, in_model=False)
    models_table = doc.table("models", data.get("models"))
    if not models_table:
        raise ConfigError(
            doc.path, "models is missing: at least one [models.NAME] table is required", key="models"
        )
    models = {
        name: parse_model(doc, name, raw, router.num_gpus, model_defaults)
        for name, raw in models_table.items()
    }
    peers = {
        name: parse_peer(doc, name, raw, models)
        for name, raw in doc.table("peers", data.get("peers")).items()
    }
    for model in models.values():
        check_model_rpc(doc, model, rpc_devices)
    pools = {
        name: parse_pool(doc, name, raw, models, remote_names(peers))
        for name, raw in doc.table("pools", data.get("pools")).items()
    }
    check_unique_names(doc, models, pools)
    keys = parse_keys(
        doc,
        doc.table("keys", data.get("keys")),
        env,
        scope_names(models, pools, peers),
        any(not peer.models for peer in peers.values()),
    )
    check_plain_keys(doc, keys, router.api_keys, _plain_keys_source(env))
    config = Config(
        path=Path(path_for_messages),
        router=router,
        devices=devices,
        rpc_devices=rpc_devices,
        defaults=defaults,
        models=models,
        pools=pools,
        peers=peers,
        keys=keys,
    )
    config = _evolve_router(config, preload=_preload(doc, config))
    if router.default_pool is not None:
        canonical = resolve_name(config, router.default_pool)
        if canonical not in pools:
            raise doc.invalid(
                "router.default_pool",
                router.default_pool,
                "must name a pool or pool alias; pools: " + (", ".join(pools) or "none defined"),
            )
        config = _evolve_router(config, default_pool=canonical)
    return config


def _preload(doc: Doc, config: Config) -> tuple[str, ...]:
    """``router.preload`` with aliases resolved; each must name a model served here."""
    out = []
    for name in config.router.preload:
        canonical = resolve_name(config, name)
        if canonical not in config.models:
            known = ", ".join(config.models)
            raise doc.invalid(
                "router.preload", name, f"must name a model or model alias here; models: {known}"
            )
        out.append(canonical)
    return tuple(out)


def config_dir(config: Config) -> Path:
    """The directory relative paths start from: the config file's, or the models folder of a configuration
    made from a folder alone (whose ``path`` is that folder)."""
    path = config.path.absolute()
    return path if path.is_dir() else path.parent


def _evolve_router(config: Config, **changes: Any) -> Config:
    return attrs.evolve(config, router=attrs.evolve(config.router, **changes))


# ----------------------------------------------------------------------------------------------- [router]


SWAP_BATCH_KEYS = ("swap_batch_max", "swap_batch_window", "swap_hold")


def _router(doc: Doc, table: Mapping[str, Any], env: Mapping[str, str]) -> RouterSettings:
    values = doc.keys("router", table, ROUTER_KEYS)
    batching = [name for name in SWAP_BATCH_KEYS if name in table]
    if "queue_head_grace" in table and batching:
        raise ConfigError(
            doc.path,
            f"router.queue_head_grace = {table['queue_head_grace']} and router.{batching[0]} are both set: "
            "queue_head_grace replaces swap batching with a timed order. Remove queue_head_grace to batch "
            f"swaps, or remove {', '.join(batching)} to keep the timed order",
            key="router.queue_head_grace",
        )
    for name in ("api_keys_file", "history_db", "replica_logs", "kv_store_dir"):
        if values[name] is not None:
            values[name] = doc.path_value(values[name])
    binary = values["llama_server"]
    if binary is not None and "/" in binary:
        values["llama_server"] = str(doc.path_value(binary))
    for spec in ROUTER_KEYS:
        text = env.get(spec.env, "").strip() if spec.env else ""
        value = _env_value(doc, spec, text) if text else ()
        if value != ():
            values[spec.name] = Path(value).expanduser() if spec.name == "history_db" else value
    if values["history_db"] is None:
        values["history_db"] = default_history_db(doc.path, env)
    if values["replica_logs"] is None:
        values["replica_logs"] = default_state_dir(env) / "logs"
    if values["kv_store_dir"] is None:
        values["kv_store_dir"] = default_state_dir(env) / "kv"
    values["api_keys"] = _unique(values["api_keys"])
    for name, problem, canonical in (
        ("cors_origins", origin_entry_problem, canonical_origin_entry),
        ("allowed_hosts", host_entry_problem, canonical_host_entry),
    ):
        values[name] = _entries(doc, name, values, env, problem, canonical)
    return RouterSettings(**values)


def _entries(
    doc: Doc,
    name: str,
    values: Mapping[str, Any],
    env: Mapping[str, str],
    problem: Callable[[str], str | None],
    canonical: Callable[[str], str],
) -> tuple[str, ...]:
    """A list of origins or host names, each checked and in canonical form, without repeats."""
    spec = spec_by_name(ROUTER_KEYS, name)
    items: Sequence[str] = values[name]
    for item in items:
        reason = problem(item.strip())
        if reason is None:
            continue
        rule = f"must be {spec.allowed()}; {reason}"
        text = env.get(spec.env or "", "").strip()
        if text:
            where = f"{spec.env} = {render_value(text)} (environment, overrides router.{name})"
            raise ConfigError(doc.path, f"{where} is invalid: {rule}", key=spec.env)
        raise doc.invalid(f"router.{name}", list(items), rule)
    return _unique([canonical(item.strip()) for item in items])


def _env_value(doc: Doc, spec: KeySpec, text: str) -> Any:
    value: Any = text
    if spec.type == STRING_LIST:
        value = tuple(part.strip() for part in text.split(",") if part.strip())
    elif spec.type == "integer":
        try:
            value = int(text)
        except ValueError:
            value = text
    try:
        return check_value(spec, value)
    except InvalidValue as exc:
        shown = spec.env if secret_key(spec.name) else f"{spec.env} = {render_value(text)}"
        raise ConfigError(
            doc.path,
            f"{shown} (environment, overrides router.{spec.name}) is invalid: {exc.reason}",
            key=spec.env,
        ) from None


def _plain_keys_source(env: Mapping[str, str]) -> str:
    """Where ``router.api_keys`` came from, in words for a message."""
    return (
        "an entry of ROUTER_API_KEYS"
        if env.get("ROUTER_API_KEYS", "").strip()
        else "an entry of router.api_keys"
    )


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item.strip() for item in items))


def read_api_keys(config: Config) -> tuple[str, ...]:
    """Every plain key: router.api_keys (or ROUTER_API_KEYS) plus the lines of router.api_keys_file, none of
    them a named client's secret (ConfigError)."""
    keys = list(config.router.api_keys)
    file = config.router.api_keys_file
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(
                config.path,
                f"router.api_keys_file = {render_value(str(file))} is invalid: must be a readable UTF-8 "
                f"file of keys ({reason})",
                key="router.api_keys_file",
            ) from None
        lines = [line.strip() for line in text.splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        doc = Doc(config.path, None)
        check_plain_keys(doc, config.keys, lines, "a line of router.api_keys_file")
        keys += lines
    return _unique(keys)


def resolve_name(config: Config, name: str) -> str | None:
    """The canonical model or pool name for a name or alias, or None when nothing answers to it."""
    if name in config.models or name in config.pools:
        return name
    for model in config.models.values():
        if name in model.aliases:
            return model.name
    for pool in config.pools.values():
        if name in pool.aliases:
            return pool.name
    return None


# ------------------------------------------------------------------------------------------------- GPUs


def resolve_gpus(model: ModelConfig, gpu_ids: Sequence[int]) -> tuple[int, ...]:
    """The GPU ids of a model: every id in ``gpu_ids`` for "all" (and for "any", the GPUs the scheduler
    chooses among), else the configured ids unchanged.

    Configured ids are not checked against ``gpu_ids`` here; ``check_gpu_ids`` does that once at startup.
    """
    if model.gpus in (ALL_GPUS, ANY_GPUS):
        return tuple(sorted(set(gpu_ids)))
    return model.gpus


def check_gpu_ids(config: Config, gpu_ids: Sequence[int]) -> None:
    """Raise ConfigError when a model or [devices.N] names a GPU the host does not have."""
    present = set(gpu_ids)
    shown = ", ".join(str(g) for g in sorted(present)) or "none"
    for model in config.models.values():
        if model.gpus in (ALL_GPUS, ANY_GPUS):
            continue
        missing = [gpu for gpu in model.gpus if gpu not in present]
        if missing:
            raise ConfigError(
                config.path,
                f"models.{model.name}.gpus = {render_value(model.gpus)} is invalid: GPU {missing[0]} "
                f"does not exist; GPUs present: {shown}",
                key=f"models.{model.name}.gpus",
            )
    for gpu in config.devices:
        if gpu not in present:
            raise ConfigError(
                config.path,
                f"devices.{gpu} is invalid: GPU {gpu} does not exist; GPUs present: {shown}",
                key=f"devices.{gpu}",
            )


def check_model_files(config: Config) -> None:
    """Raise ConfigError naming the path when a model's GGUF file is missing or cannot be read."""
    for model in config.models.values():
        try:
            with model.path.open("rb") as file:
                file.read(1)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if isinstance(exc, IsADirectoryError):
                reason = "it is a directory"
            raise ConfigError(
                config.path,
                f"models.{model.name}.model = {render_value(str(model.path))} is invalid: the model file "
                f"{model.path} cannot be read ({reason}); fix the path (relative paths start at the config "
                "file's directory) or the file's permissions",
                key=f"models.{model.name}.model",
            ) from None
