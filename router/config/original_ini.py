"""Reading the presets.ini of the original llama-router: sections of ``key = value`` lines, every value a
string, and turning those strings into the values our document holds.

The file is llama.cpp's preset format: ``[*]`` holds settings for every model, each other section one
model. Keys keep their case and order; ``;`` and ``#`` start comment lines. Values are read as written, then
:func:`scalar` makes ``true``/``false`` booleans and digits numbers, and the router-only keys get their own
readers (:func:`gpus_value`, :func:`string_list`, :func:`table_value`).
"""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path
from typing import Any

from router.config.values import ConfigError

__all__ = ["GLOBAL_SECTION", "gpus_value", "read_presets", "scalar", "string_list", "table_value"]

GLOBAL_SECTION = "*"
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def read_presets(path: Path) -> dict[str, dict[str, str]]:
    """Every section of the file (``[*]`` included) as an ordered {key: raw text} table."""
    parser = configparser.ConfigParser(
        interpolation=None, strict=True, comment_prefixes=("#", ";"), inline_comment_prefixes=None
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(path, f"cannot read the presets file: {reason}") from None
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise ConfigError(path, f"not a valid presets file: {_first_line(str(exc))}") from None
    return {name: dict(parser.items(name, raw=True)) for name in parser.sections()}


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _unquoted(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def scalar(text: str) -> str | int | float | bool:
    """``true``/``false`` (any case) → bool, an integer → int, a decimal → float, else the text unquoted."""
    value = text.strip()
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        return float(value)
    return _unquoted(value)


def string_list(text: str) -> list[str]:
    """A JSON list of strings, or items separated by commas."""
    value = text.strip()
    if value.startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list):
            return [str(item) for item in parsed]
        value = value.strip("[]")
    return [_unquoted(part) for part in value.split(",") if part.strip()]


def gpus_value(text: str) -> Any:
    """``all``, ``-1``, one id, ``0,1`` or ``[0, 1]`` as our ``gpus`` value (anything else is returned as
    the text, so that validating it names the problem)."""
    value = _unquoted(text)
    if value.lower() == "all":
        return "all"
    items = [part.strip() for part in value.strip("[]").split(",")]
    if value.strip("[]").strip() == "":
        return []
    if all(_INT.fullmatch(item) for item in items):
        ids = [int(item) for item in items]
        return ids[0] if len(ids) == 1 and not value.startswith("[") else ids
    return value


def table_value(text: str) -> Any:
    """A JSON object (or list) written on one line; the text itself when it is neither."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip()
