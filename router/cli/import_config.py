"""``python -m router import-config CONFIG_JSON [PRESETS_INI]``: an original llama-router configuration
pair rewritten as our TOML.

The translation is the one the router applies when it is started on the pair itself
(``router.config.original``), validated the same way, so the output loads as it is and
``python -m router plan --config FILE`` checks it. A key whose meaning changes on the way gets a comment
above it; keys with no counterpart are listed, with the reason, at the top.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from router.config.load import ConfigError, read_document, validated
from router.config.original import Note, Translation, is_original, presets_file, translate

__all__ = ["import_command", "render_toml"]

WIDTH = 110
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
ORIGINAL_PORT = 11434


def import_command(config_json: Path, presets_ini: Path | None, env: Mapping[str, str] | None = None) -> int:
    """Print the TOML for the pair; 2 (with the reason on stderr) when it cannot be translated."""
    env = os.environ if env is None else env
    try:
        data = read_document(config_json)
        if not is_original(data):
            raise ConfigError(
                config_json, "not an original llama-router config.json: it has no ROUTER or LLM section"
            )
        if presets_ini is not None and not presets_ini.is_file():
            raise ConfigError(presets_ini, "cannot read the presets file: no such file")
        translation = translate(config_json, data, presets_ini or presets_file(config_json, env))
        validated(
            translation.document,
            config_json,
            env={},
            base_dir=config_json.absolute().parent,
            translation=translation,
        )
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(render_toml(translation), end="")
    return 0


def render_toml(translation: Translation) -> str:
    doc = translation.document
    sources = str(translation.config_file)
    if translation.presets_file is not None:
        sources += f" and {translation.presets_file}"
    lines = _comment(
        f"llama-router configuration imported from {sources} (written by `python -m router import-config`). "
        'Check it with `python -m router plan --config FILE`; README.md, "Coming from the original '
        'llama-router", explains the mapping.'
    )
    ignored = translation.ignored()
    if ignored:
        lines += ["#", "# Not carried over:"]
        for note in ignored:
            lines += _comment(f"{note.origin}: {note.text}", indent="#   ", follow="#     ")
    by_target: dict[str, list[Note]] = {}
    for note in translation.notes:
        if note.target is not None:
            by_target.setdefault(note.target, []).append(note)
    router = dict(doc.get("router", {}))
    lines += ["", "[router]"]
    if "port" not in router:
        lines += _comment(
            f"The original listened on {ORIGINAL_PORT} when API-port was unset; this router's default port "
            "is 8080. Uncomment to keep clients working unchanged."
        )
        lines.append(f"# port = {ORIGINAL_PORT}")
    lines += _table(router, "router", by_target)
    if doc.get("defaults"):
        lines += ["", "[defaults]"]
        lines += _table(doc["defaults"], "defaults", by_target)
    for name, table in doc["models"].items():
        lines += ["", f"[models.{_key(name)}]"]
        lines += _table(table, f"models.{name}", by_target)
    return "\n".join(lines) + "\n"


def _table(table: Mapping[str, Any], prefix: str, by_target: Mapping[str, Sequence[Note]]) -> list[str]:
    lines: list[str] = []
    for key, value in table.items():
        for note in by_target.get(f"{prefix}.{key}", ()):
            lines += _comment(f"{note.origin}: {note.text}")
        lines.append(f"{_key(key)} = {_value(value)}")
    return lines


def _comment(text: str, *, indent: str = "# ", follow: str | None = None) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=indent, subsequent_indent=follow or indent, break_on_hyphens=False
    )


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _value(value: Any) -> str:
    """A TOML value: strings as basic strings, lists as arrays, tables inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return json.dumps(str(value))
