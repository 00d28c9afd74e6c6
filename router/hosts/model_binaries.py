"""The llama-server binaries of models that name their own (``[models.NAME] llama_server``), checked at
start and on every reload like the router's own: the file exists and is executable (a bare name: found on
PATH), and its ``--help`` lists llama-server's flags, against which the model's flags are then checked
(``router.hosts.server_flags.check_flags``). Unlike the router's binary, a model's binary whose flags cannot
be read is refused: a binary of one's own is there to be run with one's own flags.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from router.config.keyspec import render_value
from router.config.values import Config, ConfigError, ModelConfig
from router.hosts.locate import LlamaServerNotFound, find_llama_server
from router.hosts.server_flags import read_flags

__all__ = ["model_binaries", "model_binary", "model_flags", "usable_binary"]

_FIX = (
    "point it at a llama-server binary (a path, relative ones starting at the config file's directory, or "
    "a name on PATH), or remove it to run router.llama_server"
)


def _problem(written: str) -> str:
    """Why ``written`` (a path or a bare name) is no binary that can be run."""
    expanded = os.path.expanduser(written)
    if "/" not in expanded:
        return f"no {written!r} on PATH" if shutil.which(expanded) is None else "it cannot be run"
    path = Path(expanded)
    if not path.exists():
        return f"{path} does not exist"
    if path.is_dir():
        return f"{path} is a directory"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable (chmod +x, or check the mount's noexec)"
    return f"{path} cannot be run"


def _refusal(config: Config, model: ModelConfig, reason: str) -> ConfigError:
    key = f"models.{model.name}.llama_server"
    return ConfigError(
        config.path, f"{key} = {render_value(model.llama_server)} is invalid: {reason}; {_FIX}", key=key
    )


def model_binary(config: Config, model: ModelConfig) -> Path:
    """The binary ``model`` names, absolute (ConfigError when there is no such executable file)."""
    assert model.llama_server is not None
    try:
        return find_llama_server(model.llama_server)
    except LlamaServerNotFound:
        raise _refusal(config, model, _problem(model.llama_server)) from None


def usable_binary(model: ModelConfig) -> Path | None:
    """The binary ``model`` names, or None when it names none or none that can be found (no error: for the
    plan, which reports refusals elsewhere)."""
    if model.llama_server is None:
        return None
    try:
        return find_llama_server(model.llama_server)
    except LlamaServerNotFound:
        return None


def model_flags(config: Config, model: ModelConfig, binary: Path) -> frozenset[str]:
    """The flags ``binary`` (the model's own) accepts; ConfigError when its ``--help`` gives none."""
    flags = read_flags(binary)
    if isinstance(flags, str):
        raise _refusal(config, model, f"its flags cannot be read: {flags}")
    return flags


def model_binaries(config: Config) -> dict[str, tuple[Path, frozenset[str]]]:
    """Each model with a binary of its own → that binary and the flags it accepts, all checked (the first
    problem raises ConfigError naming the key, the value and the fix)."""
    out = {}
    for name, model in config.models.items():
        if model.llama_server is not None:
            binary = model_binary(config, model)
            out[name] = (binary, model_flags(config, model, binary))
    return out
