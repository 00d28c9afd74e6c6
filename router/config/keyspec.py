"""A configuration key as data: :class:`KeySpec` (name, type, default, range, description) and the checks
derived from it.

``router.config.schema`` lists every key of every table as a KeySpec. The loader in ``router.config.load``
validates plain keys with :func:`check_value` and renders its error messages from :meth:`KeySpec.allowed`;
``router.config.reference`` renders the same records as the configuration reference, so the documentation
and the checks cannot drift apart.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = [
    "BOOLEAN",
    "INTEGER",
    "NUMBER",
    "PATH",
    "STRING",
    "STRING_LIST",
    "InvalidValue",
    "KeySpec",
    "check_value",
    "render_value",
    "spec_by_name",
]

# Value kinds that check_value understands; keys with any other type string are checked by the loader.
INTEGER = "integer"
NUMBER = "number"
STRING = "string"
BOOLEAN = "boolean"
STRING_LIST = "list of strings"
PATH = "path"


class InvalidValue(Exception):
    """A value broke a rule; ``reason`` reads well after "is invalid: " (e.g. "must be an integer >= 1")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.frozen
class KeySpec:
    """One configuration key: its name, value type, default, description and range.

    ``default`` is the value used when the key is absent (``None``: unset). ``default_text`` replaces the
    rendered default in the reference where the real default is computed (a path under the state directory,
    "auto"). ``env`` names the environment variable that overrides the key, if any.
    """

    name: str
    type: str
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] = ()
    env: str | None = None
    required: bool = False
    default_text: str | None = None
    rule: str | None = None

    def allowed(self) -> str:
        """The rule in words, e.g. "an integer >= 1", "a number > 0", "one of "lru", "fifo"."."""
        if self.rule is not None:
            return self.rule
        if self.choices:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        noun = {
            INTEGER: "an integer",
            NUMBER: "a number",
            STRING: "a non-empty string",
            BOOLEAN: "true or false",
            STRING_LIST: "a list of non-empty strings",
            PATH: "a non-empty path string",
        }.get(self.type, self.type)
        return noun + _range_words(self.minimum, self.maximum, self.exclusive_minimum)

    def default_repr(self) -> str:
        """The default as it would be written in TOML, or a description of a computed default."""
        if self.default_text is not None:
            return self.default_text
        if self.default is None:
            return "unset"
        return render_value(self.default)


def _range_words(minimum: float | None, maximum: float | None, exclusive: bool) -> str:
    def num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)

    if minimum is not None and maximum is not None:
        return f" between {num(minimum)} and {num(maximum)}"
    if minimum is not None:
        return f" {'>' if exclusive else '>='} {num(minimum)}"
    if maximum is not None:
        return f" <= {num(maximum)}"
    return ""


def render_value(value: Any) -> str:
    """A value as TOML/JSON would spell it: strings quoted, booleans lower case, lists in brackets."""
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def check_value(spec: KeySpec, value: Any) -> Any:
    """Check a present value against ``spec`` and return it normalised.

    Integers are accepted where numbers are expected (and become floats); booleans are never accepted as
    numbers; lists become tuples. Raises :class:`InvalidValue` with the rule in words.
    """
    must = InvalidValue("must be " + spec.allowed())
    if spec.type == INTEGER:
        if isinstance(value, bool) or not isinstance(value, int):
            raise must
        _check_range(spec, value, must)
        return value
    if spec.type == NUMBER:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise must
        _check_range(spec, value, must)
        return float(value)
    if spec.type == BOOLEAN:
        if not isinstance(value, bool):
            raise must
        return value
    if spec.type in (STRING, PATH):
        if not isinstance(value, str) or not value.strip():
            raise must
        if spec.choices and value not in spec.choices:
            raise must
        return value
    if spec.type == STRING_LIST:
        if not isinstance(value, list | tuple):
            raise must
        if not all(isinstance(item, str) and item.strip() for item in value):
            raise must
        return tuple(value)
    raise AssertionError(f"{spec.name} has type {spec.type!r}, which the loader checks itself")


def _check_range(spec: KeySpec, value: float, error: InvalidValue) -> None:
    if spec.minimum is not None:
        if spec.exclusive_minimum and not value > spec.minimum:
            raise error
        if not spec.exclusive_minimum and value < spec.minimum:
            raise error
    if spec.maximum is not None and value > spec.maximum:
        raise error


def spec_by_name(specs: Sequence[KeySpec], name: str) -> KeySpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(name)
