"""One router per request-history database: an exclusive ``flock`` on ``<history_db>.lock`` while it runs.

Two routers writing one SQLite history would mix their requests and fight over pruning, so a second router
whose ``history_db`` is already held is refused at startup with a ConfigError naming the file and the keys
that choose another. The lock file stays after exit (removing it would race with a router starting); the
kernel drops the lock when the process ends, however it ends. Where the lock file cannot be created (an
unwritable directory, say) the router starts anyway with a warning: the history itself copes with a
broken database, and a request never depends on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from router.config.keyspec import render_value
from router.config.values import Config, ConfigError

log = logging.getLogger("router")


def lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".lock")


def _holder(fd: int) -> str:
    """The holder's pid as " (pid N)", from the lock file's contents; "" when they say nothing useful."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
        return f" (pid {pid})"
    return ""


@contextlib.contextmanager
def history_lock(config: Config) -> Iterator[None]:
    """Hold the history database of ``config`` for this router, or raise ConfigError when another has it."""
    db = config.router.history_db
    path = lock_path(db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        log.warning(
            "request history: cannot create the lock file %s (%s); nothing stops a second router from "
            "writing %s too",
            path,
            exc.strerror or exc,
            db,
        )
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                config.path,
                f"router.history_db = {render_value(str(db))} is in use: another llama-router{_holder(fd)} "
                f"writes its request history there (lock {path}); give this router its own file with "
                "`history_db` in [router] or the HISTORY_DB_PATH environment variable",
                key="router.history_db",
            ) from None
        except OSError as exc:
            log.warning("request history: cannot lock %s (%s); running without the lock", path, exc)
        else:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    finally:
        os.close(fd)
