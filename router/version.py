"""The router's own version, from the installed package's metadata (a leaf: imports nothing of the router, so
every layer may ask)."""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "llama-router"


@functools.cache
def package_version() -> str:
    """The installed package's version; from pyproject.toml when running from a source tree without one."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        with (Path(__file__).resolve().parent.parent / "pyproject.toml").open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
