"""The llama-server command-line flags the simulator reads; any other flag is skipped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Options:
    """The llama-server command-line flags the simulator reads."""

    host: str = "127.0.0.1"
    port: int = 8080
    model: str = ""
    ctx: int = 4096
    parallel: int = 1
    n_gpu_layers: int = -1
    metrics: bool = False
    alias: str | None = None
    slot_save_path: str | None = None


_VALUE_FLAGS: dict[str, str] = {
    "--host": "host",
    "--port": "port",
    "-m": "model",
    "--model": "model",
    "-c": "ctx",
    "--ctx-size": "ctx",
    "-np": "parallel",
    "--parallel": "parallel",
    "-ngl": "n_gpu_layers",
    "--gpu-layers": "n_gpu_layers",
    "--n-gpu-layers": "n_gpu_layers",
    "-a": "alias",
    "--alias": "alias",
    "--slot-save-path": "slot_save_path",
}
_INT_FIELDS = frozenset({"port", "ctx", "parallel", "n_gpu_layers"})


def _looks_like_value(arg: str) -> bool:
    if not arg.startswith("-"):
        return True
    try:
        float(arg)
    except ValueError:
        return False
    return True


def parse_args(args: list[str]) -> Options:
    """Read the flags the simulator cares about; skip any other ``--flag [value]``."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, eq, inline = arg.partition("=")
        if name in _VALUE_FLAGS:
            if eq:
                value = inline
            elif i < len(args):
                value = args[i]
                i += 1
            else:
                raise SystemExit(f"error: {name} needs a value")
            key = _VALUE_FLAGS[name]
            found[key] = int(value) if key in _INT_FIELDS else value
        elif name == "--metrics":
            found["metrics"] = True
        elif arg.startswith("-") and not eq and i < len(args) and _looks_like_value(args[i]):
            i += 1  # an unknown flag with a value
    return Options(**found)
