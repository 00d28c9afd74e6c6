"""A loading replica's progress, read from real processes' /proc entries (this test's own and children it
starts), and the tracker's rules (never back, read at most every FRESH seconds) on a /proc tree it writes."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.shell.load_progress import (
    FRESH,
    WEIGHTS,
    LoadProgressTracker,
    measure,
    milestone,
    model_files,
    read_bytes,
    resident_bytes,
)
from router.shell.processes import ReplicaProcessInfo

MIB = 1 << 20
PAGE = 4096
PROC = Path("/proc")


def info(pid: int | None, model: Path | str, started_at: float | None = 100.0) -> ReplicaProcessInfo:
    argv = ("llama-server", "--port", "9", "-m", str(model), "-ngl", "99")
    return ReplicaProcessInfo(1, "m", pid, 9, argv, started_at, False, False, None, None)


def weights(path: Path, mib: int) -> Path:
    path.write_bytes(b"\x01" * (mib * MIB))
    return path


def test_the_model_files_are_the_model_argument_and_every_shard_of_a_split_model(tmp_path: Path) -> None:
    cwd = os.path.realpath(tmp_path)
    assert model_files(["llama-server", "-m", "m.gguf"], cwd) == [os.path.join(cwd, "m.gguf")]
    assert model_files(["llama-server", "--model", "/w/q-00002-of-00003.gguf"], "/") == [
        "/w/q-00001-of-00003.gguf",
        "/w/q-00002-of-00003.gguf",
        "/w/q-00003-of-00003.gguf",
    ]
    assert model_files(["llama-server", "--port", "1"], cwd) == []
    assert model_files(["llama-server", "-m"], cwd) == []  # a flag without its value names nothing


def test_a_mappings_resident_size_counts_the_pages_the_process_touched(tmp_path: Path) -> None:
    path = weights(tmp_path / "w.gguf", 8)
    files = {os.path.realpath(path)}
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        assert resident_bytes((PROC / "self" / "smaps").read_text(), files) == 0
        total = sum(mapped[offset] for offset in range(0, 4 * MIB, PAGE))
        assert total == 4 * MIB // PAGE
        touched = resident_bytes((PROC / "self" / "smaps").read_text(), files) or 0
        assert 4 * MIB <= touched <= 4 * MIB + 256 * 1024  # the kernel may map a few pages around a fault
        assert resident_bytes((PROC / "self" / "smaps").read_text(), {"/elsewhere.gguf"}) is None
    finally:
        mapped.close()


def test_every_mapping_of_the_files_counts_and_nothing_else() -> None:
    smaps = (
        "7f00-7f80 r--s 00000000 08:01 12 /m/a-00001-of-00002.gguf\nSize: 512 kB\nRss: 100 kB\n"
        "7f80-7f90 r-xp 00000000 08:01 13 /usr/lib/libggml.so\nRss: 9000 kB\n"
        "7f90-7fa0 r--s 00000000 08:01 14 /m/a-00002-of-00002.gguf (deleted)\nSize: 4 kB\nRss: 20 kB\n"
        "7fa0-7fb0 rw-p 00000000 00:00 0 \nRss: 7000 kB\n"
    )
    shards = {"/m/a-00001-of-00002.gguf", "/m/a-00002-of-00002.gguf"}
    assert resident_bytes(smaps, shards) == 120 * 1024
    assert resident_bytes(smaps, {"/m/a-00001-of-00002.gguf"}) == 100 * 1024
    assert resident_bytes(smaps, {"/usr/lib"}) is None  # a path's prefix is no mapping of it


CHILD = """
import mmap, sys
f = open(sys.argv[1], "rb")
mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if sys.argv[2] == "map" else None
for line in sys.stdin:
    share = float(line)
    size = len(mapped) if mapped is not None else int(sys.argv[3])
    if mapped is not None:
        sum(mapped[o] for o in range(0, int(size * share), 4096))
    else:
        f.seek(0)
        f.read(int(size * share))
    print("done", flush=True)
"""


def child(path: Path, how: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", CHILD, str(path), how, str(path.stat().st_size)]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=path.parent)


def advance(proc: subprocess.Popen[str], share: float) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{share}\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "done\n"


@pytest.mark.parametrize("how", ["map", "read"])
def test_a_process_that_maps_or_reads_its_weights_shows_how_far_it_has_come(tmp_path: Path, how: str) -> None:
    path = weights(tmp_path / "w.gguf", 32)
    proc = child(path, how)
    try:
        replica = info(proc.pid, "w.gguf")  # relative: read against the process's working directory
        advance(proc, 0.0)
        start = measure(replica, [], PROC, 110.0)
        advance(proc, 0.5)
        half = measure(replica, [], PROC, 112.0)
        advance(proc, 1.0)
        whole = measure(replica, [], PROC, 115.0)
    finally:
        proc.kill()
        proc.wait()
    assert start is not None and half is not None and whole is not None
    source = "mapped" if how == "map" else "read"
    assert (half.source, whole.source) == (source, source)
    assert start.fraction < 0.1 * WEIGHTS  # what the interpreter read to start is small beside the weights
    assert 0.45 * WEIGHTS <= half.fraction <= 0.6 * WEIGHTS
    assert whole.fraction == WEIGHTS and whole.percent == 90
    assert (start.seconds, half.seconds, whole.seconds) == (10.0, 12.0, 15.0)


def test_the_log_milestones_after_the_weights_take_it_towards_100() -> None:
    lines = ["llama_model_loader: loaded meta data", "llama_context: n_ctx = 4096"]
    assert milestone(lines[:1]) == 0.0
    assert milestone(lines) == 0.92
    later = ["srv  load_model: initializing slots, n_slots = 1", "main: model loaded"]
    assert milestone([*lines, *later]) == 0.98
    assert milestone(["main: HTTP server is listening"]) == 0.0  # older builds say it before the load
    assert read_bytes("rchar: 2048\nwchar: 10\n") == 2048 and read_bytes("") == 0


def test_a_process_that_cannot_be_read_has_no_measure(tmp_path: Path) -> None:
    assert measure(info(None, tmp_path / "w.gguf"), [], PROC, 1.0) is None
    assert measure(info(2**22 + 7, tmp_path / "w.gguf"), [], PROC, 1.0) is None  # no such process


class FakeProc:
    """A /proc tree with one process whose mapping of ``file`` holds what the test writes."""

    def __init__(self, root: Path, file: Path) -> None:
        self.base = root / "41"
        self.base.mkdir(parents=True)
        (self.base / "cwd").symlink_to(file.parent)
        (self.base / "io").write_text("rchar: 0\n")
        self.file = file
        self.resident(0)

    def resident(self, kib: int) -> None:
        (self.base / "smaps").write_text(
            f"7f00-7f80 r--s 00000000 08:01 12 {os.path.realpath(self.file)}\nSize: 1 kB\nRss: {kib} kB\n"
            "7f80-7f90 rw-p 00000000 00:00 0 \nRss: 999999 kB\n"
        )


def test_the_tracker_never_goes_back_and_reads_at_most_every_fresh_seconds(tmp_path: Path) -> None:
    file = weights(tmp_path / "w.gguf", 1)
    proc = FakeProc(tmp_path / "proc", file)
    now = [200.0]
    tracker = LoadProgressTracker(tmp_path / "proc", clock=lambda: now[0])
    replica = info(41, file)
    lines: list[str] = []
    assert tracker.of(replica, lambda: lines).fraction == 0.0
    proc.resident(512)
    assert tracker.of(replica, lambda: lines).fraction == 0.0  # read FRESH seconds ago: the same answer
    now[0] += FRESH
    half = tracker.of(replica, lambda: lines)
    assert (half.fraction, half.source, half.seconds) == (WEIGHTS / 2, "mapped", 100.0 + FRESH)
    proc.resident(128)  # pages reclaimed: what the process read stays read
    now[0] += FRESH
    kept = tracker.of(replica, lambda: lines)
    assert (kept.fraction, kept.seconds) == (WEIGHTS / 2, 100.0 + 2 * FRESH)
    lines.append("srv    load_model: initializing slots, n_slots = 1")
    now[0] += FRESH
    logged = tracker.of(replica, lambda: lines).document()
    assert logged == {"percent": 96, "seconds": round(100.0 + 3 * FRESH, 1), "source": "log"}
    tracker.forget(1)
    (tmp_path / "proc" / "41" / "smaps").unlink()
    now[0] += FRESH
    unread = tracker.of(replica, lambda: lines)
    assert (unread.fraction, unread.source) == (0.0, "starting")
