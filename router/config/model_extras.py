"""The model keys that shape a replica's process and the requests it gets: ``llama_server`` (its own
binary), ``env`` (extra environment variables), ``set_params`` and ``strip_params`` (request body fields
forced on or removed from every request the model serves).

Used by ``router.config.tables`` for ``[models.NAME]`` and ``[defaults]``; every function raises
ConfigError through the :class:`~router.config.tables.Doc` it is given, naming the key, the value and the
fix. Values come out frozen (``FrozenMap`` for tables, tuples for arrays) so that a configuration stays
hashable; ``router.http.body_filters`` turns ``set_params`` back into JSON.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from router.frozenmap import FrozenMap


class Doc(Protocol):
    """What these checks need of ``router.config.tables.Doc`` (which imports this module): its errors, and
    paths relative to the config file."""

    def invalid(self, key: str, value: Any, reason: str) -> Exception: ...

    def path_value(self, text: str) -> Path: ...


# Body fields the router itself reads to route, stream and account a request: no filter may touch them.
RESERVED_FIELDS: tuple[str, ...] = ("model", "stream", "messages", "prompt", "input")
# Variables the router sets on every replica to show it only its own GPUs (``gpu_env`` and
# ``router.deploy.masking``), and those that would renumber the GPUs under it: never from a model's env.
MASKING_VARIABLES: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "GGML_VK_VISIBLE_DEVICES",
    "ONEAPI_DEVICE_SELECTOR",
)
# llama-server reads LLAMA_ARG_<FLAG> as the flag <FLAG>: such a variable would bypass the flag rules.
FLAG_VARIABLE_PREFIX = "LLAMA_ARG_"
FLAG_VARIABLES: tuple[str, ...] = ("LLAMA_API_KEY",)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

JsonValue = Any  # str | int | float | bool | None | tuple[JsonValue, ...] | FrozenMap[str, JsonValue]


def frozen_json(value: Any) -> JsonValue | None:
    """``value`` as a frozen JSON value (tables → FrozenMap, arrays → tuples); None when it is no JSON
    value (a TOML date or time, a non-finite float, a table key that is not a string)."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        items = [frozen_json(item) for item in value]
        if any(item is None and raw is not None for item, raw in zip(items, value, strict=True)):
            return None
        return tuple(items)
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            return None
        out = {key: frozen_json(item) for key, item in value.items()}
        if any(out[key] is None and item is not None for key, item in value.items()):
            return None
        return FrozenMap(out)
    return None


def thawed_json(value: JsonValue) -> Any:
    """A frozen JSON value as ``json.dumps`` takes it (FrozenMap → dict, tuple → list)."""
    if isinstance(value, Mapping):
        return {key: thawed_json(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thawed_json(item) for item in value]
    return value


def _reserved(doc: Doc, key: str, value: Any, field: str) -> None:
    if field in RESERVED_FIELDS:
        raise doc.invalid(
            key,
            value,
            f"the router reads the field {field!r} itself (to route, stream or account the request), so no "
            f"filter may change it; remove {field!r} (fields the router keeps: {', '.join(RESERVED_FIELDS)})",
        )


def parse_set_params(doc: Doc, key: str, value: Any) -> FrozenMap[str, JsonValue]:
    """``set_params``: a table of body fields and the JSON values forced on every request."""
    if not isinstance(value, Mapping):
        raise doc.invalid(
            key, value, "must be a table of request fields and their values, e.g. { temperature = 0.2 }"
        )
    out: dict[str, JsonValue] = {}
    for field, item in value.items():
        if not isinstance(field, str) or not field.strip():
            raise doc.invalid(key, value, "a field name must be a non-empty string")
        _reserved(doc, f"{key}.{field}", item, field)
        if item is None:
            raise doc.invalid(
                f"{key}.{field}", item, "must be a value; to remove the field, list it in strip_params"
            )
        frozen = frozen_json(item)
        if frozen is None:
            raise doc.invalid(
                f"{key}.{field}",
                item,
                "must be a JSON value: a string, a finite number, true/false, an array or a table (no dates)",
            )
        out[field] = frozen
    return FrozenMap(out)


def parse_strip_params(doc: Doc, key: str, value: Any) -> tuple[str, ...]:
    """``strip_params``: the body fields removed from every request, without repeats."""
    if not isinstance(value, list | tuple) or not all(isinstance(f, str) and f.strip() for f in value):
        raise doc.invalid(key, value, 'must be a list of request field names, e.g. ["top_k", "seed"]')
    for field in value:
        _reserved(doc, key, list(value), field)
    if len(set(value)) != len(value):
        raise doc.invalid(key, list(value), "names a field twice; list each field once")
    return tuple(value)


def check_filters(
    doc: Doc,
    set_key: str,
    set_params: Mapping[str, Any],
    strip_key: str,
    strip_params: tuple[str, ...],
) -> None:
    """A field may be forced or removed, not both; ``set_key`` and ``strip_key`` name where each list
    came from (the model's table or ``[defaults]``)."""
    for field in strip_params:
        if field in set_params:
            also = ""
            if set_key.split(".")[0] != strip_key.split(".")[0]:
                also = " (a model's own key replaces the one in [defaults]: an empty one clears it)"
            raise doc.invalid(
                strip_key,
                list(strip_params),
                f"{field!r} is also in {set_key}; a field is either set or stripped: remove it from one of "
                f"them{also}",
            )


def check_model_filters(doc: Doc, prefix: str, table: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """:func:`check_filters` for the table at ``prefix`` (a model's or ``defaults``), whose checked keys
    are in ``values``; a key the table does not set came from ``[defaults]``."""

    def where(key: str) -> str:
        return f"{prefix}.{key}" if table.get(key) is not None else f"defaults.{key}"

    set_params = values.get("set_params") or {}
    check_filters(
        doc, where("set_params"), set_params, where("strip_params"), values.get("strip_params") or ()
    )


def parse_env(doc: Doc, key: str, value: Any) -> FrozenMap[str, str]:
    """``env``: environment variable names and their string values (an integer becomes its digits)."""
    if not isinstance(value, Mapping):
        raise doc.invalid(key, value, 'must be a table of variable names and strings, e.g. { NAME = "1" }')
    out: dict[str, str] = {}
    for name, item in value.items():
        dotted = f"{key}.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise doc.invalid(
                dotted, item, "a variable name must be letters, digits and _, not starting with a digit"
            )
        if name in MASKING_VARIABLES:
            raise doc.invalid(
                dotted,
                item,
                "the router sets the GPU masks of every replica itself (each sees only its model's GPUs); "
                "choose the GPUs with the model's `gpus` key and remove this variable",
            )
        if name.startswith(FLAG_VARIABLE_PREFIX) or name in FLAG_VARIABLES:
            raise doc.invalid(
                dotted,
                item,
                "llama-server reads this variable as a flag, past the router's checks; write the flag as "
                "a key of the model's table instead, and remove this variable",
            )
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str) or "\0" in item:
            raise doc.invalid(
                dotted, item, 'must be a string (quote it: NAME = "1"); an integer is also taken'
            )
        out[name] = item
    return FrozenMap(out)


def parse_llama_server(doc: Doc, key: str, value: Any) -> str:
    """``llama_server`` of a model: a path (relative ones start at the config file's directory) or a bare
    name looked up on PATH, as ``router.llama_server``."""
    if not isinstance(value, str) or not value.strip():
        raise doc.invalid(
            key, value, "must be a non-empty path string: the llama-server binary of this model"
        )
    return str(doc.path_value(value)) if "/" in value else value


# The model keys parsed here: (doc, dotted key, value) -> the checked value.
EXTRA_PARSERS: Mapping[str, Callable[[Doc, str, Any], Any]] = {
    "llama_server": parse_llama_server,
    "env": parse_env,
    "set_params": parse_set_params,
    "strip_params": parse_strip_params,
}
