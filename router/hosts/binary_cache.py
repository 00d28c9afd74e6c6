"""What running a llama-server binary once told us, kept on disk so that the next start does not ask again.

A reading is a small JSON file under the router's home directory, ``KIND-<hash>.json`` (``flags-...`` for
the flags of ``--help``, ``build-...`` for the build of ``--version``), keyed by the binary's absolute path,
modification time and size: a rebuilt or replaced binary is asked again. Writing is best effort (a cache
that cannot be written only costs one more run next time), and each kind keeps its newest
``KEEP_CACHE_FILES`` files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from router.hosts.locate import router_home

log = logging.getLogger("router")

KEEP_CACHE_FILES = 32

Key = tuple[str, int, int]  # (absolute path, st_mtime_ns, st_size)


def run_binary(binary: Path, flag: str, timeout: float) -> tuple[int, str] | str:
    """Run ``binary flag`` once: its exit status and what it printed (stdout, then stderr), or why it gave
    nothing (it cannot run, or did not finish within ``timeout`` seconds)."""
    try:
        done = subprocess.run(
            [str(binary), flag], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return f"did not finish within {timeout:.0f} s"
    except OSError as exc:
        return f"cannot run: {exc.strerror or exc}"
    return done.returncode, (done.stdout + b"\n" + done.stderr).decode("utf-8", "replace")


def binary_key(binary: Path) -> Key:
    """The cache key of ``binary``; OSError when it cannot be read."""
    info = binary.stat()
    return (str(binary.absolute()), info.st_mtime_ns, info.st_size)


def cache_file(kind: str, key: Key) -> Path:
    digest = hashlib.sha256("\0".join(str(part) for part in key).encode()).hexdigest()[:16]
    return router_home() / f"{kind}-{digest}.json"


def read_cached(kind: str, key: Key) -> dict[str, Any] | None:
    """The cached reading of ``kind`` for the binary of ``key``; None when there is none (or it is stale)."""
    try:
        data = json.loads(cache_file(kind, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or (data.get("binary"), data.get("mtime_ns"), data.get("size")) != key:
        return None
    return data


def write_cached(kind: str, key: Key, fields: Mapping[str, Any]) -> None:
    """Keep a reading of ``kind`` for the binary of ``key`` (best effort)."""
    path = cache_file(kind, key)
    data = {"binary": key[0], "mtime_ns": key[1], "size": key[2], **fields}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{kind}-", suffix=".tmp")
    except OSError as exc:
        log.debug("cannot cache the %s of %s in %s: %s", kind, key[0], path.parent, exc)
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(data, file)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("cannot cache the %s of %s in %s: %s", kind, key[0], path, exc)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    _prune(path.parent, kind)


def _prune(directory: Path, kind: str) -> None:
    """Keep the newest KEEP_CACHE_FILES readings of ``kind`` (every rebuilt or moved binary leaves one)."""
    files = []
    for path in directory.glob(f"{kind}-*.json"):
        with contextlib.suppress(OSError):
            files.append((path.stat().st_mtime, path))
    for _, path in sorted(files, reverse=True)[KEEP_CACHE_FILES:]:
        with contextlib.suppress(OSError):
            path.unlink()
