"""A server in a process of its own for a blocking test: started with its output in a log file, handed over
once ``/health`` answers 200, stopped afterwards (SIGTERM, then SIGKILL if it lingers).

Both the real llama-server of the real tier and ``python -m router`` for module-wide fixtures start here.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import httpx

from tests.support.waiting import NotReached, until_blocking


class NotReady(RuntimeError):
    """The process exited, or did not answer ``/health`` in time; the message holds its log."""


@attrs.frozen
class Launched:
    """A started server: its base URL, its process and the file its output goes to."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def launched(
    argv: Sequence[str],
    url: str,
    log_path: Path,
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    ready_timeout: float = 60.0,
    stop_timeout: float = 10.0,
    user: int | None = None,
) -> Iterator[Launched]:
    """Run ``argv`` (stdout and stderr to ``log_path``) until the block ends; ``url`` is where it serves.
    ``user``: the uid (and gid) it runs as, for a root test that plays an unprivileged service account.

    Raises :class:`NotReady`, naming the process ``name``, when it exits or is not ready within
    ``ready_timeout`` seconds; it is stopped either way."""
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=None if cwd is None else str(cwd),
            user=user,
            group=user,
            extra_groups=None if user is None else [],
        )
    server = Launched(url, process, log_path)
    try:
        _wait_ready(server, name, ready_timeout)
        yield server
    finally:
        stop(process, stop_timeout)


def _wait_ready(server: Launched, name: str, timeout: float) -> None:
    with httpx.Client(timeout=5.0) as client:

        def ready_or_gone() -> bool:
            return server.process.poll() is not None or client.get(f"{server.url}/health").status_code == 200

        try:
            until_blocking(ready_or_gone, timeout=timeout, ignore=(httpx.TransportError,))
        except NotReached:
            raise NotReady(f"{name} not ready after {timeout} s:\n{server.log_text()}") from None
    if server.process.poll() is not None:
        raise NotReady(f"{name} exited with {server.process.returncode}:\n{server.log_text()}")


def stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM ``process`` if it still runs; SIGKILL it if it has not exited ``timeout`` seconds later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
