"""The original llama-router's configuration (a config.json with ``ROUTER`` and ``LLM`` sections plus a
llama.cpp presets.ini), translated into our document before validation.

:func:`is_original` tells the two formats apart: ours never has upper-case or hyphenated top-level keys.
:func:`translate` builds our document from the pair and records, for every key it writes, where the value
came from (an :class:`Origin`), so that :meth:`Translation.explain` can name the original file and key in
a validation error. What has no counterpart here becomes a :class:`Note` without a target (logged as a
warning at startup); a value that changes meaning on the way becomes a note on its new key (shown as a
comment by ``python -m router import-config``).

The presets file is ``LLAMA_PRESETS_PATH`` when set, else ``presets.ini`` beside the config.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from router.config.keyspec import render_value
from router.config.llama_args import flag_identity, router_owned_hint
from router.config.original_ini import (
    GLOBAL_SECTION,
    gpus_value,
    read_presets,
    scalar,
    string_list,
    table_value,
)
from router.config.values import ConfigError

__all__ = ["PRESETS_ENV", "Note", "Origin", "Translation", "is_original", "presets_file", "translate"]

PRESETS_ENV = "LLAMA_PRESETS_PATH"
TOP_LEVEL = ("ROUTER", "LLM", "API-port", "LLM-base-port", "llama-server-executable")

# ROUTER keys with a direct counterpart in [router].
ROUTER_MAP: Mapping[str, str] = {
    "MAX_MODELS_PER_GPU": "max_models_per_gpu",
    "EVICTION_POLICY": "eviction",
    "QUEUE_HEAD_GRACE": "queue_head_grace",
    "QUEUE_FORCE_LOAD_TIMEOUT": "queue_force_load_timeout",
    "NUM_GPUS": "num_gpus",
    "GRACEFUL_KILL_TIMEOUT": "stop_timeout",
}
# The two waits of a load in the original (process up, then model loaded) with its defaults; our
# load_timeout covers both, so it becomes their sum.
LOAD_WAITS: Mapping[str, float] = {"HEALTH_CHECK_TIMEOUT": 30.0, "LOAD_POLL_TIMEOUT": 120.0}
_POLLING = (
    "the router probes replicas on its own schedule; router.load_timeout and hang_timeout bound the waits"
)
ROUTER_IGNORED: Mapping[str, str] = {
    "HEALTH_CHECK_INTERVAL": _POLLING,
    "LOAD_POLL_INTERVAL": _POLLING,
    "UNLOAD_POLL_INTERVAL": _POLLING,
    "UNLOAD_POLL_TIMEOUT": "replicas are stopped by signal, with router.stop_timeout between SIGTERM and "
    "SIGKILL; there is no unload to wait for",
    "START_RETRIES": "a failed load is not retried as such: the requests waiting only for that model get 503 "
    "with the reason once no replica of it is alive, and the next request loads it again",
}
# Preset keys (by llama-server flag identity) the router does not pass on, and why.
PRESET_IGNORED: Mapping[str, str] = {
    "device": "each replica sees only the GPUs of its model's gpus (CUDA_VISIBLE_DEVICES), so a device key "
    "is not needed",
    "main-gpu": "each replica sees only the GPUs of its model's gpus, renumbered from 0",
    "models-preset": "the router manages models itself (one llama-server per model replica)",
    "models-autoload": "the router loads models on demand itself",
    "stop-timeout": "router.stop_timeout applies to every replica",
}
PRICING_NAMES = ("input", "cached_input", "output")
EFFORT_NAMES = ("options", "default", "disable")


@attrs.frozen
class Origin:
    """Where a value was written: the file, and the key as the original format names it."""

    file: Path
    key: str

    def __str__(self) -> str:
        return f"{self.file.name} {self.key}"


@attrs.frozen
class Note:
    """A key that does not carry over one-to-one. ``target`` None: it is ignored (``text`` says why);
    else the dotted key it became, and how it differs."""

    origin: Origin
    text: str
    target: str | None = None


@attrs.frozen
class Translation:
    """Our document for an original config pair, where each of its keys came from, and the notes."""

    document: dict[str, Any] = attrs.field(eq=False)
    origins: Mapping[str, Origin]
    notes: tuple[Note, ...]
    config_file: Path
    presets_file: Path | None

    def origin_of(self, key: str | None) -> Origin | None:
        """The origin of a dotted key or of the closest table above it."""
        while key:
            if key in self.origins:
                return self.origins[key]
            key = key.rpartition(".")[0]
        return None

    def explain(self, exc: ConfigError) -> ConfigError:
        """The validation error ``exc`` restated against the original file and key it came from."""
        origin = self.origin_of(exc.key)
        if origin is None:
            return exc
        return ConfigError(origin.file, f"{origin.key}: {exc.detail}", key=exc.key)

    def ignored(self) -> tuple[Note, ...]:
        return tuple(note for note in self.notes if note.target is None)


def is_original(data: Any) -> bool:
    """Whether a parsed config.json is in the original format (upper-case ROUTER/LLM sections or the
    hyphenated port and executable keys)."""
    return isinstance(data, Mapping) and any(key in TOP_LEVEL for key in data)


def presets_file(config_file: Path, env: Mapping[str, str]) -> Path | None:
    """LLAMA_PRESETS_PATH when set (it must exist), else presets.ini beside the config file, else None."""
    named = env.get(PRESETS_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(
                path, f"{PRESETS_ENV} = {render_value(named)} is invalid: no such file", key=PRESETS_ENV
            )
        return path
    beside = config_file.absolute().parent / "presets.ini"
    return beside if beside.is_file() else None


def translate(config_file: Path, data: Mapping[str, Any], presets: Path | None) -> Translation:
    """Our configuration document for the original ``data`` (config_file's content) and presets file."""
    builder = _Builder(config_file, presets)
    builder.top_level(data)
    return Translation(
        document=builder.document(),
        origins=dict(builder.origins),
        notes=tuple(builder.notes),
        config_file=config_file,
        presets_file=presets,
    )


class _Builder:
    def __init__(self, config_file: Path, presets: Path | None) -> None:
        self.config_file = config_file
        self.presets = presets
        self.router: dict[str, Any] = {}
        self.defaults: dict[str, Any] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.origins: dict[str, Origin] = {}
        self.notes: list[Note] = []

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"models": self.models}
        if self.router:
            doc["router"] = self.router
        if self.defaults:
            doc["defaults"] = self.defaults
        return doc

    # ------------------------------------------------------------------------------------------ helpers

    def json_origin(self, key: str) -> Origin:
        return Origin(self.config_file, key)

    def put(self, table: dict[str, Any], prefix: str, key: str, value: Any, origin: Origin) -> None:
        table[key] = value
        self.origins[f"{prefix}.{key}"] = origin

    def ignore(self, origin: Origin, reason: str) -> None:
        self.notes.append(Note(origin, reason))

    def changed(self, origin: Origin, target: str, text: str) -> None:
        self.notes.append(Note(origin, text, target))

    def section(self, key: str, value: Any) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(
                self.config_file, f"{key} = {render_value(value)} is invalid: must be a JSON object", key=key
            )
        return value

    # ---------------------------------------------------------------------------------------- config.json

    def top_level(self, data: Mapping[str, Any]) -> None:
        for key, value in data.items():
            origin = self.json_origin(str(key))
            if key == "API-port":
                self.put(self.router, "router", "port", value, origin)
            elif key == "llama-server-executable":
                self.put(self.router, "router", "llama_server", value, origin)
            elif key == "LLM-base-port":
                self.ignore(origin, "the router gives every replica a free port of its own")
            elif key not in ("ROUTER", "LLM"):
                self.ignore(origin, "not a key of the original config.json")
        self.router_section(self.section("ROUTER", data.get("ROUTER")))
        self.model_tables(self.section("LLM", data.get("LLM")))

    def router_section(self, table: Mapping[str, Any]) -> None:
        waits: dict[str, Any] = {}
        for key, value in table.items():
            origin = self.json_origin(f"ROUTER.{key}")
            if key in ROUTER_MAP:
                if key == "EVICTION_POLICY" and isinstance(value, str):
                    value = value.strip().lower()
                self.put(self.router, "router", ROUTER_MAP[key], value, origin)
            elif key in LOAD_WAITS:
                waits[key] = value
            elif key in ROUTER_IGNORED:
                self.ignore(origin, ROUTER_IGNORED[key])
            else:
                self.ignore(origin, "not a key of the original ROUTER section")
        if waits:
            self.load_timeout(waits)

    def load_timeout(self, waits: Mapping[str, Any]) -> None:
        origin = self.json_origin("ROUTER." + " + ROUTER.".join(waits))
        parts = [waits.get(key, default) for key, default in LOAD_WAITS.items()]
        numbers = all(isinstance(p, int | float) and not isinstance(p, bool) for p in parts)
        value = sum(parts) if numbers else next(p for p in parts if not isinstance(p, int | float))
        self.put(self.router, "router", "load_timeout", value, origin)
        self.changed(
            origin,
            "router.load_timeout",
            "one limit for the whole load: the original's HEALTH_CHECK_TIMEOUT (process up) plus "
            "LOAD_POLL_TIMEOUT (model loaded), each at its default of 30 and 120 s where unset",
        )

    # ------------------------------------------------------------------------------------------- models

    def model_tables(self, llm: Mapping[str, Any]) -> None:
        sections = read_presets(self.presets) if self.presets is not None else {}
        globals_ = sections.pop(GLOBAL_SECTION, {})
        self.origins["models"] = self.json_origin("LLM")
        names = [str(name) for name in llm] + [name for name in sections if name not in llm]
        per_model: dict[str, tuple[Any, Origin]] = {}
        for key, text in globals_.items():
            origin = Origin(self.presets or self.config_file, f"[{GLOBAL_SECTION}] {key}")
            item = _preset_item(key, text)
            if item.kind == "flag":
                self.flag(self.defaults, "defaults", item.name, item.value, origin)
            elif item.kind == "ignored":
                self.ignore(origin, item.reason)
            elif item.name in ("model", "aliases"):
                self.ignore(origin, f"{key} names one model; set it in that model's section")
            else:
                per_model[item.name] = (item.value, origin)
        for name in names:
            table: dict[str, Any] = {}
            prefix = f"models.{name}"
            self.origins[prefix] = (
                self.json_origin(f"LLM.{name}") if name in llm else self.section_origin(name)
            )
            entry = self.section(f"LLM.{name}", llm.get(name))
            for key, value in entry.items():
                self.llm_key(table, prefix, str(key), value)
            for key, text in sections.get(name, {}).items():
                self.preset_key(table, prefix, name, key, text)
            for key, (value, origin) in per_model.items():
                if key not in table:
                    self.model_value(table, prefix, key, value, origin)
                    self.changed(
                        origin,
                        f"{prefix}.{key}",
                        "set for every model in [*]; our format keeps it in each model",
                    )
            self.finish_model(table, prefix, name)
            self.models[name] = table

    def section_origin(self, name: str) -> Origin:
        return Origin(self.presets or self.config_file, f"[{name}]")

    def llm_key(self, table: dict[str, Any], prefix: str, key: str, value: Any) -> None:
        origin = self.json_origin(f"{prefix.replace('models.', 'LLM.', 1)}.{key}")
        if key in ("num_instance", "gpus"):
            self.put(table, prefix, key, value, origin)
        elif key == "reasoning_effort":
            self.merge(table, prefix, key, _effort_table(value), origin)
        elif key in ("reasoning_effort_default", "reasoning_effort_disable"):
            self.merge(table, prefix, "reasoning_effort", {key.rpartition("_")[2]: value}, origin)
        elif key == "cost":
            self.model_value(table, prefix, "pricing", value, origin)
        else:
            self.ignore(
                origin, "not a key of the original LLM section (llama.cpp settings go in presets.ini)"
            )

    def preset_key(self, table: dict[str, Any], prefix: str, name: str, key: str, text: str) -> None:
        origin = Origin(self.presets or self.config_file, f"[{name}] {key}")
        item = _preset_item(key, text)
        if item.kind == "ignored":
            self.ignore(origin, item.reason)
            return
        if item.kind == "flag":
            self.flag(table, prefix, item.name, item.value, origin)
            return
        if item.name == "model" and isinstance(item.value, str) and self.presets is not None:
            item = attrs.evolve(
                item, value=str(self.presets.absolute().parent / Path(item.value).expanduser())
            )
        first = self.origins.get(f"{prefix}.{item.name}")
        merged = item.name in ("reasoning_effort", "pricing")
        if item.name in table and not merged and first is not None and first.file != origin.file:
            self.ignore(origin, f"{first} already sets it, and config.json wins")
            return
        self.model_value(table, prefix, item.name, item.value, origin)

    def model_value(self, table: dict[str, Any], prefix: str, key: str, value: Any, origin: Origin) -> None:
        if key in ("reasoning_effort", "pricing"):
            self.merge(table, prefix, key, value, origin)
            return
        self.put(table, prefix, key, value, origin)
        if key == "gpu_layers":
            self.changed(
                origin,
                f"{prefix}.{key}",
                "an operator override: placement uses it as given instead of choosing (the model's layer "
                "count + 1 or more offloads every layer)",
            )

    def flag(self, table: dict[str, Any], prefix: str, key: str, value: Any, origin: Origin) -> None:
        self.put(table, prefix, key, value, origin)

    def merge(self, table: dict[str, Any], prefix: str, key: str, value: Any, origin: Origin) -> None:
        """reasoning_effort and pricing may be given whole or a part at a time; config.json wins."""
        current = table.get(key)
        if not isinstance(value, Mapping) or not isinstance(current, dict):
            self.put(table, prefix, key, dict(value) if isinstance(value, Mapping) else value, origin)
            if isinstance(value, Mapping):
                for part in value:
                    self.origins[f"{prefix}.{key}.{part}"] = origin
            return
        for part, item in value.items():
            first = self.origins.get(f"{prefix}.{key}.{part}")
            if part in current and first is not None and first.file != origin.file:
                self.ignore(origin, f"{first} already sets it, and config.json wins")
                continue
            self.put(current, f"{prefix}.{key}", str(part), item, origin)

    def finish_model(self, table: dict[str, Any], prefix: str, name: str) -> None:
        if "model" not in table:
            if self.presets is None:
                raise ConfigError(
                    self.config_file,
                    f"LLM.{name} has no model file: no presets.ini was found beside this file and "
                    f"{PRESETS_ENV} is not set; give the model's section there a model = PATH",
                    key=f"{prefix}.model",
                )
            raise ConfigError(
                self.presets,
                f"[{name}] has no model key: the section of every model in config.json's LLM needs "
                "model = PATH (the GGUF file)",
                key=f"{prefix}.model",
            )
        effort = table.get("reasoning_effort")
        if isinstance(effort, dict) and "default" not in effort:
            options = effort.get("options")
            if isinstance(options, list) and options and isinstance(options[0], str):
                effort["default"] = options[0]
                origin = self.origins.get(f"{prefix}.reasoning_effort.options") or self.origins[prefix]
                self.changed(
                    origin,
                    f"{prefix}.reasoning_effort",
                    "the original advertised the first option as the default when none was named",
                )


@attrs.frozen
class _Item:
    """What a presets.ini key becomes: a model key of ours, a llama-server flag, or nothing (why)."""

    kind: str  # "model", "flag" or "ignored"
    name: str = ""
    value: Any = None
    reason: str = ""


def _effort_table(value: Any) -> Any:
    """The original's reasoning_effort (a list of levels, or a table with options/default/disable) as our
    table; a comma-separated string counts as a list."""
    if isinstance(value, str):
        value = string_list(value)
    if isinstance(value, list):
        return {"options": value}
    return value


def _preset_item(key: str, text: str) -> _Item:
    bare = key.lstrip("-")
    head, dot, part = bare.partition(".")
    if bare == "num_instance":
        return _Item("model", "num_instance", scalar(text))
    if bare == "gpus":
        return _Item("model", "gpus", gpus_value(text))
    if bare == "reasoning_effort":
        return _Item("model", "reasoning_effort", _effort_table(table_value(text)))
    if bare in ("reasoning_effort_default", "reasoning_effort_disable", "disable"):
        return _Item("model", "reasoning_effort", {bare.rpartition("_")[2]: scalar(text)})
    if dot and head == "reasoning_effort" and part in EFFORT_NAMES:
        value: Any = string_list(text) if part == "options" else scalar(text)
        return _Item("model", "reasoning_effort", {part: value})
    if bare == "cost":
        return _Item("model", "pricing", table_value(text))
    if dot and head == "cost" and part in PRICING_NAMES:
        return _Item("model", "pricing", {part: scalar(text)})
    identity = flag_identity(key)
    direct = {
        "model": "model",
        "ctx-size": "ctx",
        "parallel": "parallel",
        "load-on-startup": "load_on_startup",
    }
    if identity in direct:
        value = text.strip() if identity == "model" else scalar(text)
        return _Item("model", direct[identity], value)
    if identity == "gpu-layers":
        value = scalar(text)
        if isinstance(value, int):
            return _Item("model", "gpu_layers", value)
        return _Item("ignored", reason="placement offloads every layer that fits unless gpu_layers says less")
    if identity == "alias":
        return _Item("model", "aliases", string_list(text))
    if identity == "cache-ram":
        return _Item("model", "cram", scalar(text))
    if identity in PRESET_IGNORED:
        return _Item("ignored", reason=PRESET_IGNORED[identity])
    hint = router_owned_hint(key)
    if hint is not None:
        return _Item("ignored", reason=f"the router sets this llama-server flag itself ({hint})")
    return _Item("flag", key, scalar(text))
