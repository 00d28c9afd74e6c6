"""``python -m router init --models-dir DIR``: a commented TOML configuration to start from.

It holds a ``[router]`` table with the main keys at their defaults, commented out (comments, defaults and
the words for computed defaults all come from the key records of ``router.config.schema``, as the README's
reference does, so they cannot drift from the loader), and one
``[models.NAME]`` table per model found in DIR (see ``router.config.model_folder``) with its file, the
detected GPUs (GPU 0 where none are detected) and its paired ``mmproj``, under a comment with the facts from
its header and the plan's verdict for it. The output loads as it is: ``python -m router plan --config FILE``.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from router.config.keyspec import KeySpec, render_value, spec_by_name
from router.config.load import ConfigError, config_from_dict
from router.config.model_folder import FolderModel, FolderScan
from router.config.schema import ROUTER_KEYS
from router.config.source import ConfigSource, folder_table
from router.deploy.bridge import plan

__all__ = ["MAIN_KEYS", "init_command", "render_init", "router_key_lines"]

WIDTH = 110
# The [router] keys a new configuration shows, in this order.
MAIN_KEYS: tuple[str, ...] = (
    "host",
    "port",
    "llama_server",
    "api_keys",
    "max_models_per_gpu",
    "eviction",
    "queue_limit",
    "load_timeout",
    "gpu_reserve_mib",
    "ctx_floor",
    "history_db",
    "replica_logs",
)
# Example values shown for keys that have no literal default (the default is computed at start: a PATH
# lookup, a file under the state directory); the comment above them states that default in words.
_EXAMPLES: Mapping[str, str] = {
    "llama_server": '"/path/to/llama-server"',
    "history_db": '"/var/lib/llama-router/history.db"',
    "replica_logs": '"/var/lib/llama-router/logs"',
}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
GiB = 1 << 30


def init_command(source: ConfigSource) -> int:
    """Print the configuration for ``source.models_dir``; 2 when there is nothing to write."""
    try:
        scan = source.scan()
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not scan.models:
        print(f"no GGUF model found in {scan.folder} or its sub-folders", file=sys.stderr)
        return 2
    doc = {"models": {m.name: folder_table(m) for m in scan.models}}
    config = config_from_dict(doc, scan.folder, env={}, base_dir=scan.folder)
    ids, _budgets, _decisions, document = plan(config)
    print(render_init(scan, ids, document), end="")
    return 0


def render_init(scan: FolderScan, gpu_ids: Sequence[int], document: Mapping[str, Any]) -> str:
    """The configuration text for the models of ``scan``; ``document`` is their plan on ``gpu_ids``."""
    verdicts = {m["name"]: m for m in document.get("models", [])}
    lines = [
        f"# llama-router configuration for the models in {scan.folder}",
        "# (written by `python -m router init`). Check it with `python -m router plan --config FILE`, run",
        '# it with `python -m router --config FILE`. README.md, "Configuration", describes every key.',
        "# The [router] keys below are commented out at their defaults; a key whose default is computed",
        "# states it in words and shows an example value instead.",
        "",
        "[router]",
    ]
    for name in MAIN_KEYS:
        lines += router_key_lines(spec_by_name(ROUTER_KEYS, name))
    for model in scan.models:
        lines += ["", f"[models.{_key(model.name)}]"]
        lines += _comment(_facts(model))
        lines += _comment(_verdict(verdicts.get(model.name)))
        lines.append(f"model = {_string(str(model.path))}")
        lines.append(f"gpus = {render_value(list(gpu_ids))}")
        if model.mmproj is not None:
            lines.append(f"mmproj = {_string(str(model.mmproj))}")
    return "\n".join(lines) + "\n"


def router_key_lines(spec: KeySpec) -> list[str]:
    """A commented-out ``[router]`` key, its comment taken from the schema: the description's first sentence
    and the key at its default; for a key without a literal default, the whole description with the default
    in words (the reference's text) after its first sentence, and an example value."""
    first, _, rest = spec.description.partition(". ")
    first = first.rstrip(".") + "."
    if spec.default is not None:
        return [*_comment(first), f"# {spec.name} = {render_value(spec.default)}"]
    text = " ".join(filter(None, [first, f"Default: {spec.default_repr()}.", rest, "For example:"]))
    return [*_comment(text), f"# {spec.name} = {_EXAMPLES[spec.name]}"]


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, for the characters json.dumps escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / (1 << 20):.1f} MiB"


def _facts(model: FolderModel) -> str:
    facts = model.facts
    parts = [f"architecture {facts.architecture}"]
    if facts.layers is not None:
        parts.append(f"{facts.layers} layers")
    if facts.trained_ctx is not None:
        parts.append(f"trained context {facts.trained_ctx}")
    files = f" in {len(model.files)} files" if len(model.files) > 1 else ""
    parts.append(f"{_gib(facts.size_bytes)}{files}")
    return "header: " + ", ".join(parts)


def _verdict(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "plan: none"
    text = f"plan: {entry['verdict']}"
    if entry.get("ctx"):
        text += f", context {entry['ctx']}"
    need = entry.get("need_by_gpu") or {}
    if need:
        text += ", needs " + ", ".join(f"{_gib(b)} on GPU {gpu}" for gpu, b in need.items())
    if entry["verdict"] == "unknown-budget":
        text += " (the GPU's memory cannot be read: declare it with [devices.N] memory_mib)"
    elif entry.get("message") and entry["verdict"] != "fits":
        text += f" ({entry['message']})"
    return text
