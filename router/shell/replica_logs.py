"""Per-replica log files: everything a llama-server replica prints, in a file of its own.

A replica of model ``qwen`` with id 3 writes ``<directory>/qwen-3.log`` (characters other than letters,
digits and ``._+-`` in the model name become ``_``). Replica ids start at 1 with every router start, so a
file may already hold an earlier run's replica: new output is appended after a ``---`` line that says which
replica started when, and :meth:`ReplicaLogFile.read_tail` reads only the current replica's part.

Files are bounded two ways: a file that would grow past ``max_bytes`` is renamed to ``<name>.log.1``
(replacing an older one) and started afresh, and when a replica's file is opened only the ``keep`` most
recently written ``<model>-<id>.log`` files of its model are kept (with their ``.1``); files of running
replicas are never removed. A directory that cannot be created or written costs a warning, never a load:
the replica's lines still reach the ring buffer and the router's DEBUG log.

Every line written to a replica's file is also handed to the readers that follow it (``ReplicaLogFile.feed``,
a :class:`~router.shell.logring.LineFeed`); closing the file ends them. ``mark`` and ``read_tail(upto=...)``
let a new reader take the file's tail up to the moment it began to follow, so that it sees each line once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from router.shell.logring import NOTE, LineFeed

__all__ = ["ReplicaLogFile", "ReplicaLogs", "file_stem"]

log = logging.getLogger("router")

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
_MAX_STEM = 120


def file_stem(model: str) -> str:
    """The part of a replica log's file name that names its model."""
    stem = _UNSAFE.sub("_", model).lstrip(".")[:_MAX_STEM]
    return stem or "model"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


@attrs.frozen
class Mark:
    """A moment in a replica's file: how many times it had been renamed away, and where the replica's part
    began and ended then."""

    rotations: int
    start: int
    end: int


class ReplicaLogFile:
    """One replica's file, open for appending; ``start`` is where the replica's part of the file begins."""

    def __init__(self, path: Path, max_bytes: int, first_line: str) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close(); one write per line
        self.start = self._size = os.fstat(self._file.fileno()).st_size
        self.closed = False
        self.rotations = 0
        self.feed = LineFeed()
        self.note(first_line)

    def note(self, text: str) -> None:
        """A line of the router's own, marked as such and stamped with the time."""
        self.write(f"{NOTE}{_now()} {text}")

    def write(self, line: str) -> None:
        self.write_lines((line,))

    def write_lines(self, lines: Sequence[str]) -> None:
        """Lines of the replica's output, in one write to the file."""
        if self.closed or not lines:
            return
        for line in lines:
            self.feed.publish(line)
        data = "\n".join(lines).encode("utf-8", errors="replace") + b"\n"
        try:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            self._file.write(data)
            self._size += len(data)
        except OSError as exc:
            log.warning(
                "cannot write %s: %s; this replica's output goes to the ring buffer only", self.path, exc
            )
            self.close()

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - as above
        self.rotations += 1
        self.start = self._size = 0
        self._file.write(f"{NOTE}{_now()} continued from {self.path.name}.1\n".encode())
        self._size = self._file.tell()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.feed.close()
            with contextlib.suppress(OSError):
                self._file.close()

    def mark(self) -> Mark:
        """Where the file stands now (see ``read_tail``)."""
        return Mark(self.rotations, self.start, self._size)

    def read_tail(self, limit: int, upto: Mark | None = None) -> str | None:
        """The last ``limit`` bytes (at most) of this replica's part of the file, from a line start; None
        when the file cannot be read any more (removed, say). ``upto``: only what was written before that
        mark (read from the renamed file when the file was renamed since)."""
        path, start, stop = self.path, self.start, None
        if upto is not None:
            start, stop = upto.start, upto.end
            if upto.rotations != self.rotations:
                if upto.rotations != self.rotations - 1:
                    return ""  # renamed twice since: that part is gone
                path = self.path.with_name(self.path.name + ".1")
        try:
            with open(path, "rb") as f:
                end = f.seek(0, os.SEEK_END) if stop is None else stop
                begin = max(start if end >= start else 0, end - limit)
                f.seek(begin)
                data = f.read(max(0, end - begin))
        except OSError:
            return None
        if begin > start and b"\n" in data:
            data = data[data.index(b"\n") + 1 :]
        return data.decode("utf-8", errors="replace")


class ReplicaLogs:
    """The directory of replica log files, with its limits."""

    def __init__(self, directory: Path, *, keep: int, max_bytes: int) -> None:
        self.directory = directory
        self.keep = max(1, keep)
        self.max_bytes = max(1, max_bytes)
        self._open: dict[Path, ReplicaLogFile] = {}
        self._warned = False

    def path(self, model: str, replica_id: int) -> Path:
        return self.directory / f"{file_stem(model)}-{replica_id}.log"

    def open(self, model: str, replica_id: int, first_line: str) -> ReplicaLogFile | None:
        """Open (append to) the file of a new replica and prune its model's old files; None when the
        directory cannot be used (warned about once)."""
        path = self.path(model, replica_id)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            stale = self._open.pop(path, None)
            if stale is not None:
                stale.close()
            file = ReplicaLogFile(path, self.max_bytes, first_line)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot write replica logs in %s (%s): replica output goes to the ring buffer and the "
                    "DEBUG log only; set [router] replica_logs to a writable directory",
                    self.directory,
                    exc.strerror or exc,
                )
            return None
        self._open[path] = file
        self._prune(model)
        return file

    def closed(self, file: ReplicaLogFile) -> None:
        """``file``'s replica has exited: close it and let pruning remove it when its time comes."""
        file.close()
        if self._open.get(file.path) is file:
            del self._open[file.path]

    def _prune(self, model: str) -> None:
        pattern = re.compile(re.escape(file_stem(model)) + r"-\d+\.log")
        found: list[tuple[float, Path]] = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                if pattern.fullmatch(entry.name) and entry.is_file():
                    with contextlib.suppress(OSError):
                        found.append((entry.stat().st_mtime, Path(entry.path)))
        found.sort(reverse=True)
        for _, path in found[self.keep :]:
            if path in self._open:
                continue
            for victim in (path, path.with_name(path.name + ".1")):
                with contextlib.suppress(OSError):
                    victim.unlink()
