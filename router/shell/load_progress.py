"""How far a loading replica has come, from what its process has done — never from the time it has taken.

Two measures, the larger wins:

- bytes: llama-server maps the GGUF file and reads its weights through the mapping (to copy them to a GPU,
  or to use them in place), so the mapping's resident size in ``/proc/PID/smaps`` grows from 0 to the file's
  size; a process with no mapping of the file (``--no-mmap`` or ``--load-mode none``, or one that has not
  mapped it yet) reads it instead, which ``rchar`` in ``/proc/PID/io`` counts. Split models
  (``name-00001-of-00003.gguf``) count all their files. The bytes make the first ``WEIGHTS`` (90 %) of the
  way;
- milestones: the lines llama-server logs after the weights (the context built, the KV cache, the slots,
  "model loaded") each raise the floor towards 100 %.

A replica's progress never goes back (``LoadProgressTracker`` keeps the highest reading), and reading it
costs a search of the replica's ``smaps`` for the GGUF mappings at most every ``FRESH`` seconds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from router.shell.processes import ReplicaProcessInfo

WEIGHTS = 0.9
FRESH = 0.25  # seconds a reading is reused
# Log fragments llama-server writes once the weights are in, in order, and the share of the load each marks.
MILESTONES: tuple[tuple[str, float], ...] = (
    ("llama_context:", 0.92),
    ("llama_kv_cache", 0.94),
    ("n_slots", 0.96),
    ("model loaded", 0.98),
)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# An smaps header line: address range, permissions, offset, device, inode, then the path.
_MAPPING = re.compile(r"[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*.*$")


@attrs.frozen
class LoadProgress:
    """``fraction`` of the load done (0..1), ``seconds`` since the process started, and what told (``mapped``,
    ``read``, ``log``, or ``starting`` before the process could be read)."""

    fraction: float
    seconds: float
    source: str

    @property
    def percent(self) -> int:
        return int(self.fraction * 100)

    def document(self) -> dict[str, object]:
        return {"percent": self.percent, "seconds": round(self.seconds, 1), "source": self.source}


def model_files(argv: Iterable[str], cwd: str) -> list[str]:
    """The GGUF files a replica loads: the ``-m``/``--model`` argument (relative to ``cwd``) and, for a split
    model, its other shards."""
    args = list(argv)
    for flag in ("-m", "--model"):
        if flag in args[:-1]:
            path = os.path.realpath(os.path.join(cwd, args[args.index(flag) + 1]))
            break
    else:
        return []
    shard = _SHARD.search(path)
    if shard is None:
        return [path]
    count = int(shard.group(2))
    stem = path[: shard.start()]
    return [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def resident_bytes(smaps: str, files: set[str]) -> int | None:
    """The resident size of the mappings of ``files`` in the text of a ``/proc/PID/smaps``; None when the
    process maps none of them. Only the mappings of ``files`` are looked at (a GPU process maps thousands of
    other things), each by its header line and the ``Rss:`` line of its block."""
    total, mapped = 0, False
    for path in files:
        for needle in (f" {path}\n", f" {path} (deleted)\n"):
            at = smaps.find(needle)
            while at >= 0:
                start = smaps.rfind("\n", 0, at) + 1
                if _MAPPING.match(smaps, start, at + len(needle) - 1) is not None:
                    mapped = True
                    rss = smaps.find("\nRss:", at)
                    if rss >= 0:
                        total += int(smaps[rss + 5 : smaps.index("kB", rss)]) * 1024
                at = smaps.find(needle, at + len(needle))
    return total if mapped else None


def read_bytes(io: str) -> int:
    """``rchar`` of a ``/proc/PID/io``: the bytes the process has read."""
    for line in io.splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def milestone(lines: Iterable[str]) -> float:
    """The share of the load the latest milestone in ``lines`` marks (0 before any)."""
    best = 0.0
    for line in lines:
        for fragment, share in MILESTONES:
            if share > best and fragment in line:
                best = share
    return best


def measure(info: ReplicaProcessInfo, lines: Iterable[str], proc: Path, now: float) -> LoadProgress | None:
    """The progress of the loading replica ``info`` (None when its process cannot be read)."""
    if info.pid is None or info.started_at is None:
        return None
    base = proc / str(info.pid)
    try:
        files = model_files(info.argv, os.path.realpath(base / "cwd"))
        size = sum(os.path.getsize(f) for f in files)
        mapped = resident_bytes((base / "smaps").read_text(errors="replace"), set(files))
        read = read_bytes((base / "io").read_text())
    except (OSError, ValueError):
        return None
    seconds = max(now - info.started_at, 0.0)
    done, source = (read, "read") if mapped is None else (mapped, "mapped")
    weights = WEIGHTS * min(done / size, 1.0) if size else 0.0
    logged = milestone(lines)
    if logged > weights:
        return LoadProgress(logged, seconds, "log")
    return LoadProgress(weights, seconds, source)


class LoadProgressTracker:
    """Each loading replica's progress, read at most every ``FRESH`` seconds and never going back."""

    def __init__(self, proc: Path = Path("/proc"), clock: Callable[[], float] = time.time) -> None:
        self.proc = proc
        self.clock = clock
        self._seen: dict[int, tuple[float, LoadProgress]] = {}

    def of(self, info: ReplicaProcessInfo, lines: Callable[[], Iterable[str]]) -> LoadProgress:
        """The progress of the loading replica ``info`` (0 %, ``starting``, while its process is unread)."""
        now = self.clock()
        known = self._seen.get(info.replica_id)
        if known is not None and now - known[0] < FRESH:
            return known[1]
        found = measure(info, lines(), self.proc, now)
        if found is None:
            if known is not None:
                return known[1]
            started = info.started_at if info.started_at is not None else now
            return LoadProgress(0.0, max(now - started, 0.0), "starting")
        if known is not None and known[1].fraction > found.fraction:
            found = attrs.evolve(known[1], seconds=found.seconds)
        self._seen[info.replica_id] = (now, found)
        return found

    def forget(self, replica: int) -> None:
        self._seen.pop(replica, None)
