"""Finding the llama-server binary and the tokenizer vocab files installed next to it.

Lookup order for the binary: the path configured as ``[router] llama_server``, then ``llama-server`` on
PATH, then the CPU build that ``scripts/install-llama-server`` puts under the router's home directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BINARY_NAME = "llama-server"
LLAMA_CPP_RELEASE = "11434"  # the release scripts/install-llama-server builds (and CI tests against)
# The oldest llama.cpp build whose llama-server takes every flag the router passes (`--fit` among them).
MINIMUM_LLAMA_CPP_BUILD = 11434
INSTALL_COMMAND = "scripts/install-llama-server"


class LlamaServerNotFound(RuntimeError):
    """No usable llama-server binary was found; the message says how to get one."""


def router_home() -> Path:
    """The router's own cache directory: $LLAMA_ROUTER_HOME, else $XDG_CACHE_HOME/llama-router."""
    explicit = os.environ.get("LLAMA_ROUTER_HOME")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "llama-router"


def install_dir() -> Path:
    """Where ``scripts/install-llama-server`` installs its CPU build."""
    return router_home() / f"llama.cpp-{LLAMA_CPP_RELEASE}"


def cached_llama_server() -> Path:
    """Path of the installed CPU build of llama-server (it may not exist yet)."""
    return install_dir() / "bin" / BINARY_NAME


def vocab_dir() -> Path:
    """Directory holding the ``ggml-vocab-*.gguf`` tokenizer files copied by the install script."""
    return install_dir() / "vocab"


def _is_executable_file(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def not_found_message(configured: str | None = None) -> str:
    lines = []
    if configured:
        lines.append(f"The configured llama_server {configured!r} is missing or not an executable file.")
    else:
        lines.append(f"No llama-server binary found (looked on PATH and at {cached_llama_server()}).")
    lines += [
        f"Build and install a CPU llama-server with: {INSTALL_COMMAND}",
        "With a GPU (CUDA or ROCm) build of llama.cpp, point the router at your own binary in the config:",
        "  [router]",
        '  llama_server = "/path/to/llama-server"',
    ]
    return "\n".join(lines)


def find_llama_server(configured: str | None) -> Path:
    """Return the llama-server binary to run, or raise :class:`LlamaServerNotFound`.

    A configured value containing a path separator must name an executable file. A bare name is looked up
    on PATH. When a value is configured but unusable the search stops there: running some other binary
    than the one asked for would be a surprise.
    """
    if configured:
        expanded = os.path.expanduser(configured)
        if os.sep in expanded or (os.altsep and os.altsep in expanded):
            candidate = Path(expanded)
            if _is_executable_file(candidate):
                return candidate.absolute()
        else:
            found = shutil.which(expanded)
            if found is not None:
                return Path(found).absolute()
        raise LlamaServerNotFound(not_found_message(configured))

    found = shutil.which(BINARY_NAME)
    if found is not None:
        return Path(found).absolute()
    cached = cached_llama_server()
    if _is_executable_file(cached):
        return cached
    raise LlamaServerNotFound(not_found_message())
