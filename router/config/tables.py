"""Validation of the per-name tables: [devices.N], [defaults], [models.NAME] and [pools.NAME].

Used by router.config.load; every function raises ConfigError through a :class:`Doc`, which knows the file
name for the message and the directory relative paths start from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from router.config.key_specs import KEY_KEYS
from router.config.keyspec import InvalidValue, KeySpec, check_value, render_value
from router.config.llama_args import flag_identity, router_owned_hint
from router.config.model_extras import EXTRA_PARSERS as _EXTRAS
from router.config.model_extras import check_model_filters
from router.config.model_keys import DEFAULTABLE_MODEL_KEYS, EFFORT_KEYS, MODEL_KEYS, PRICING_KEYS
from router.config.schema import CACHE_TYPES, DEVICE_KEYS, POOL_KEYS
from router.config.values import (
    ALL_GPUS,
    ANY_GPUS,
    ConfigError,
    DeviceConfig,
    FlagValue,
    FrozenMap,
    GpuSelection,
    ModelConfig,
    PoolConfig,
    Pricing,
    ReasoningEffort,
)

MAX_NAME = 200
_MODEL_ROUTER_KEYS = frozenset(spec.name for spec in MODEL_KEYS)
# Keys whose values are secrets wherever they are written (api_keys, a peer's api_key, llama-server's
# --api-key, a typo of one of them), and the keys of [keys.NAME] that are not.
_SECRET_NAMES = frozenset({"key", "keys", "api_key", "api_keys", "apikey", "api-key", "secret", "token"})
_PUBLIC_CLIENT_KEYS = frozenset(spec.name for spec in KEY_KEYS if spec.name != "key")


def secret_key(key: str) -> bool:
    """Whether the value of the dotted ``key`` may be a secret, so that no message may show it: any key
    named like a secret, and anything in ``[keys]`` but the keys of a client's table that hold none."""
    parts = key.split(".")
    if parts[-1].lstrip("-").lower() in _SECRET_NAMES:
        return True
    if parts[0] == "keys":
        return not (len(parts) == 3 and parts[2] in _PUBLIC_CLIENT_KEYS)
    return False


class Doc:
    """Context for error messages: the file name, and the directory relative paths start from."""

    def __init__(self, path: str | Path, base_dir: Path | None) -> None:
        self.path = path
        self.base_dir = base_dir

    def invalid(self, key: str, value: Any, reason: str) -> ConfigError:
        shown = f"{key} = {render_value(value)}" if not secret_key(key) else key
        return ConfigError(self.path, f"{shown} is invalid: {reason}", key=key)

    def unknown(self, key: str, value: Any, allowed: Sequence[str]) -> ConfigError:
        """An unknown key; its value is shown unless it may hold a secret or is a table (whose contents
        could)."""
        shown = key
        if not secret_key(key) and not isinstance(value, Mapping):
            shown = f"{key} = {render_value(value)}"
        return ConfigError(
            self.path, f"{shown} is not a known key; allowed keys: {', '.join(allowed)}", key=key
        )

    def missing(self, key: str, allowed: str) -> ConfigError:
        return ConfigError(self.path, f"{key} is missing: it is required and must be {allowed}", key=key)

    def table(self, key: str, value: Any) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.invalid(key, value, "must be a table")
        return value

    def path_value(self, text: str) -> Path:
        path = Path(text).expanduser()
        if self.base_dir is not None and not path.is_absolute():
            path = self.base_dir / path
        return path

    def check(self, prefix: str, spec: KeySpec, value: Any) -> Any:
        try:
            return check_value(spec, value)
        except InvalidValue as exc:
            raise self.invalid(f"{prefix}.{spec.name}", value, exc.reason) from None

    def keys(self, prefix: str, table: Mapping[str, Any], specs: Sequence[KeySpec]) -> dict[str, Any]:
        """The value of every key of ``specs`` in ``table`` (checked, or its default); an unknown key or a
        missing required one is an error."""
        allowed = [spec.name for spec in specs]
        for key, value in table.items():
            if key not in allowed:
                raise self.unknown(f"{prefix}.{key}", value, allowed)
        values: dict[str, Any] = {}
        for spec in specs:
            value = table.get(spec.name)
            if value is None:
                if spec.required:
                    raise self.missing(f"{prefix}.{spec.name}", spec.allowed())
                values[spec.name] = spec.default
            else:
                values[spec.name] = self.check(prefix, spec, value)
        return values


# ---------------------------------------------------------------------------------------------- [devices]


def parse_devices(doc: Doc, table: Mapping[str, Any], num_gpus: int | None) -> FrozenMap[int, DeviceConfig]:
    devices: dict[int, DeviceConfig] = {}
    for key, raw in table.items():
        gpu = _gpu_id_key(key)
        if gpu is None or (num_gpus is not None and gpu >= num_gpus):
            rule = "must be a GPU id: an integer >= 0"
            if num_gpus is not None:
                rule += f" and < router.num_gpus ({num_gpus})"
            raise ConfigError(
                doc.path, f"devices.{key} is invalid: the table name {rule}", key=f"devices.{key}"
            )
        entry = doc.table(f"devices.{key}", raw)
        devices[gpu] = DeviceConfig(**doc.keys(f"devices.{key}", entry, DEVICE_KEYS))
    return FrozenMap(sorted(devices.items()))


def _gpu_id_key(key: Any) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if isinstance(key, str) and key.isascii() and key.isdigit() and str(int(key)) == key:
        return int(key)
    return None


# --------------------------------------------------------------------------------- flags ([defaults], models)


def parse_flags(
    doc: Doc, prefix: str, table: Mapping[str, Any], *, in_model: bool
) -> FrozenMap[str, FlagValue]:
    seen: dict[str, str] = {}
    flags: dict[str, FlagValue] = {}
    for key, value in table.items():
        dotted = f"{prefix}.{key}"
        if value is None:
            continue
        if not in_model and key.lstrip("-") in DEFAULTABLE_MODEL_KEYS:
            raise doc.invalid(dotted, value, f"write the router key without dashes: {key.lstrip('-')}")
        if not in_model and key == "llama_server":
            raise doc.invalid(
                dotted, value, "set router.llama_server for every model, or llama_server in [models.NAME]"
            )
        if not in_model and key in _MODEL_ROUTER_KEYS:
            raise doc.invalid(dotted, value, f"{key} is a per-model key; set it in [models.NAME]")
        if (
            in_model
            and key.lstrip("-") in _MODEL_ROUTER_KEYS
            and key.lstrip("-") not in ("model", "parallel")
        ):
            raise doc.invalid(dotted, value, f"write the router key without dashes: {key.lstrip('-')}")
        if (
            not key.lstrip("-")
            or len(key) - len(key.lstrip("-")) > 2
            or any(c.isspace() or c == "=" for c in key)
        ):
            raise doc.invalid(
                dotted, value, "a llama-server flag name must be non-empty, without spaces or '='"
            )
        hint = router_owned_hint(key)
        if hint is not None:
            raise doc.invalid(dotted, value, f"the router sets this llama-server flag itself; {hint}")
        identity = flag_identity(key)
        if identity in seen:
            raise doc.invalid(
                dotted, value, f"the same llama-server flag as {prefix}.{seen[identity]}; keep one"
            )
        seen[identity] = key
        flags[key] = _flag_value(doc, dotted, value)
        if identity in ("cache-type-k", "cache-type-v") and value is not False and value not in CACHE_TYPES:
            choices = ", ".join(json.dumps(t) for t in CACHE_TYPES)
            raise doc.invalid(dotted, value, f"must be one of {choices} (or false to drop a default)")
    return FrozenMap(flags)


def _flag_value(doc: Doc, key: str, value: Any) -> FlagValue:
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return value
    if isinstance(value, list | tuple) and all(
        isinstance(item, str | int | float) and not isinstance(item, bool) for item in value
    ):
        return tuple(value)
    raise doc.invalid(
        key,
        value,
        "a llama-server flag must be a string, a number, true/false, or a list of strings and numbers",
    )


# ----------------------------------------------------------------------------------------------- [models]


def valid_name(name: Any) -> bool:
    """Whether ``name`` may name a model, pool or alias: 1 to 200 printable characters without spaces."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME
        and not any(c.isspace() or not c.isprintable() for c in name)
    )


def check_name(doc: Doc, key: str, name: Any, what: str) -> str:
    if not valid_name(name):
        raise doc.invalid(key, name, f"{what} must be 1 to {MAX_NAME} printable characters without spaces")
    return name


def parse_model_defaults(doc: Doc, table: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``[defaults]`` split into the model keys it may set (checked: ``DEFAULTABLE_MODEL_KEYS``) and the
    rest (llama-server flags, for :func:`parse_flags`)."""
    specs = {spec.name: spec for spec in MODEL_KEYS}
    keys = {
        key: doc.check("defaults", specs[key], value)
        for key, value in table.items()
        if key in DEFAULTABLE_MODEL_KEYS and value is not None and key != "gpus" and key not in _EXTRAS
    }
    if table.get("gpus") is not None:
        keys["gpus"] = _gpus(doc, "defaults.gpus", table["gpus"], None)
    for key, parse in _EXTRAS.items():
        if key in DEFAULTABLE_MODEL_KEYS and table.get(key) is not None:
            keys[key] = parse(doc, f"defaults.{key}", table[key])
    check_model_filters(doc, "defaults", table, keys)
    return keys, {key: value for key, value in table.items() if key not in DEFAULTABLE_MODEL_KEYS}


def parse_model(
    doc: Doc, name: str, raw: Any, num_gpus: int | None, defaults: Mapping[str, Any] | None = None
) -> ModelConfig:
    """``[models.NAME]``; ``defaults`` holds the model keys ``[defaults]`` set (see parse_model_defaults)."""
    prefix = f"models.{name}"
    check_name(doc, prefix, name, "a model name")
    table = doc.table(prefix, raw)
    specs = {spec.name: spec for spec in MODEL_KEYS}
    values: dict[str, Any] = {}
    for spec in MODEL_KEYS:
        value = table.get(spec.name)
        if value is None and defaults is not None and spec.name in defaults:
            values[spec.name] = defaults[spec.name]
        elif value is None:
            if spec.required:
                raise doc.missing(f"{prefix}.{spec.name}", spec.allowed())
            if spec.name == "gpus" and num_gpus == 0:
                values["gpus"] = ()  # num_gpus = 0: every model runs on the CPU
                continue
            if spec.name == "gpus" and num_gpus is not None and max(spec.default) >= num_gpus:
                raise ConfigError(
                    doc.path,
                    f"{prefix}.gpus is unset and defaults to {render_value(spec.default)}, but "
                    f'router.num_gpus = {num_gpus}; set gpus to ids below {num_gpus} or to "all"',
                    key=f"{prefix}.gpus",
                )
            values[spec.name] = spec.default
            if spec.name == "gpus" and num_gpus is None:
                values["gpus_named"] = False
        elif spec.name == "gpus":
            values["gpus"] = _gpus(doc, f"{prefix}.gpus", value, num_gpus)
        elif spec.name == "pricing":
            values["pricing"] = _pricing(doc, f"{prefix}.pricing", value)
        elif spec.name == "reasoning_effort":
            values["reasoning_effort"] = _effort(doc, f"{prefix}.reasoning_effort", value)
        elif spec.name in _EXTRAS:
            values[spec.name] = _EXTRAS[spec.name](doc, f"{prefix}.{spec.name}", value)
        else:
            values[spec.name] = doc.check(prefix, specs[spec.name], value)
    for i, alias in enumerate(values["aliases"]):
        check_name(doc, f"{prefix}.aliases[{i}]", alias, "an alias")
    if values["ctx"] is not None and values["ctx"] < values["parallel"]:
        raise doc.invalid(
            f"{prefix}.ctx",
            values["ctx"],
            f"must be >= parallel ({values['parallel']}): each slot gets ctx/parallel",
        )
    if values["gpus"] == ANY_GPUS and values["rpc"]:
        raise doc.invalid(
            f"{prefix}.gpus",
            ANY_GPUS,
            'a model with rpc devices runs on the GPUs it names: list them (or "all"), or remove rpc',
        )
    if table.get("gpus_max") is None and values["gpus"] != ANY_GPUS:
        values["gpus_max"] = None  # [defaults] gpus_max only shapes the models the scheduler places
    if values["gpus_max"] is not None and values["gpus"] != ANY_GPUS:
        raise doc.invalid(
            f"{prefix}.gpus_max",
            values["gpus_max"],
            'only a model the scheduler places has it: set gpus = "any", or remove gpus_max',
        )
    if values["pinned"] and values["ttl"] is not None:
        raise doc.invalid(
            f"{prefix}.ttl",
            values["ttl"],
            "a pinned model is never unloaded; remove ttl or set pinned = false",
        )
    check_model_filters(doc, prefix, table, values)
    flags = parse_flags(doc, prefix, {k: v for k, v in table.items() if k not in specs}, in_model=True)
    return ModelConfig(
        name=name,
        path=doc.path_value(values.pop("model")),
        extra_args=tuple(flags.items()),
        **values,
    )


def _gpus(doc: Doc, key: str, value: Any, num_gpus: int | None) -> GpuSelection:
    rule = 'must be "all", "any", -1, a GPU id, [] (CPU only) or a list of distinct GPU ids (integers >= 0'
    rule += f" and < router.num_gpus = {num_gpus})" if num_gpus is not None else ")"
    if isinstance(value, list | tuple) and not value:
        return ()  # explicitly CPU only
    if value == ALL_GPUS or (isinstance(value, int) and not isinstance(value, bool) and value == -1):
        return ALL_GPUS
    if value == ANY_GPUS:
        return ANY_GPUS
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(ids, list | tuple) or not ids:
        raise doc.invalid(key, value, rule)
    for gpu in ids:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise doc.invalid(key, value, rule)
        if num_gpus is not None and gpu >= num_gpus:
            raise doc.invalid(key, value, rule)
    if len(set(ids)) != len(ids):
        raise doc.invalid(key, value, rule)
    return tuple(sorted(ids))


def _number_at_least_zero(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value >= 0
        and value != float("inf")
    )


def _pricing(doc: Doc, key: str, value: Any) -> Pricing:
    table = doc.table(key, value)
    for name, item in table.items():
        if name not in PRICING_KEYS:
            raise doc.unknown(f"{key}.{name}", item, PRICING_KEYS)
        if item is not None and not _number_at_least_zero(item):
            raise doc.invalid(f"{key}.{name}", item, "must be a number >= 0 (dollars per million tokens)")
    prices = {name: float(table[name]) for name in PRICING_KEYS if table.get(name) is not None}
    if not prices:
        raise doc.invalid(key, value, "must set at least one of " + ", ".join(PRICING_KEYS))
    return Pricing(**prices)


def _effort(doc: Doc, key: str, value: Any) -> ReasoningEffort:
    table = doc.table(key, value)
    for name, item in table.items():
        if name not in EFFORT_KEYS:
            raise doc.unknown(f"{key}.{name}", item, EFFORT_KEYS)
    options = table.get("options")
    if (
        not isinstance(options, list | tuple)
        or not options
        or not all(isinstance(o, str) and o.strip() for o in options)
        or len(set(options)) != len(options)
    ):
        raise doc.invalid(f"{key}.options", options, "must be a non-empty list of distinct non-empty strings")
    default = table.get("default")
    if default is not None and default not in options:
        raise doc.invalid(
            f"{key}.default",
            default,
            "must be one of the options: " + ", ".join(json.dumps(o) for o in options),
        )
    disable = table.get("disable")
    if disable is not None and (not isinstance(disable, str) or not disable.strip()):
        raise doc.invalid(
            f"{key}.disable", disable, "must be a non-empty string: the level that turns reasoning off"
        )
    return ReasoningEffort(options=tuple(options), default=default, disable=disable)


# ------------------------------------------------------------------------------------------------ [pools]


def parse_pool(
    doc: Doc,
    name: str,
    raw: Any,
    models: Mapping[str, ModelConfig],
    remote: tuple[set[str], bool] = (set(), False),
) -> PoolConfig:
    """``remote``: the model names peers list, and whether a peer discovers its models (then a member that
    is no model here may be one of a peer's, resolved at run time)."""
    prefix = f"pools.{name}"
    check_name(doc, prefix, name, "a pool name")
    values = doc.keys(prefix, doc.table(prefix, raw), POOL_KEYS)
    members: tuple[str, ...] = values["members"]
    known = ", ".join(models)
    if not members:
        raise doc.invalid(
            f"{prefix}.members", list(members), f"must list at least one model; models: {known}"
        )
    listed, discovering = remote
    for member in members:
        if member not in models and (member in listed or discovering):
            continue  # a peer's model
        if member not in models:
            owner = next((m.name for m in models.values() if member in m.aliases), None)
            reason = f"{member!r} is not a model; models: {known}"
            if listed:
                reason += f"; models of peers: {', '.join(sorted(listed))}"
            if owner is not None:
                reason = f"{member!r} is an alias of models.{owner}; list model names ({known})"
            raise doc.invalid(f"{prefix}.members", list(members), reason)
    if len(set(members)) != len(members):
        raise doc.invalid(f"{prefix}.members", list(members), "must not name a model twice")
    if values["fallback"]:
        if len(members) < 2:
            raise doc.invalid(f"{prefix}.fallback", True, "fallback = true needs at least two members")
        for member in members:
            ttl = models[member].ttl if member in models else None
            if ttl is not None:
                raise doc.invalid(
                    f"{prefix}.fallback",
                    True,
                    f"fallback members stay loaded, but models.{member}.ttl = {render_value(ttl)}; "
                    "remove that ttl",
                )
    for i, alias in enumerate(values["aliases"]):
        check_name(doc, f"{prefix}.aliases[{i}]", alias, "an alias")
    return PoolConfig(name=name, **values)


# ------------------------------------------------------------------------------------------------- names


def check_unique_names(doc: Doc, models: Mapping[str, ModelConfig], pools: Mapping[str, PoolConfig]) -> None:
    owner: dict[str, str] = {}
    for name in models:
        owner[name] = f"models.{name}"
    for name in pools:
        if name in owner:
            raise ConfigError(
                doc.path,
                f"pools.{name} is invalid: the name {name!r} is already used by {owner[name]}; every "
                "model, pool and alias name must be unique",
                key=f"pools.{name}",
            )
        owner[name] = f"pools.{name}"
    entries = [(f"models.{m.name}", m.aliases) for m in models.values()]
    entries += [(f"pools.{p.name}", p.aliases) for p in pools.values()]
    for prefix, aliases in entries:
        for alias in aliases:
            if alias in owner:
                raise doc.invalid(
                    f"{prefix}.aliases",
                    list(aliases),
                    f"the alias {alias!r} is already used by {owner[alias]}; every model, pool and alias "
                    "name must be unique",
                )
            owner[alias] = f"{prefix}.aliases"
