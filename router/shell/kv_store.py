"""Saved KV states of llama-server slots on disk: where they go, which one to restore, what to forget.

A replica is started with ``--slot-save-path`` pointing at its *shelf*: one folder per model file and
cache-affecting flags (:func:`shelf_name`), so a state is only ever restored into a replica that can read it.
A saved state is two files on its shelf: ``NAME.bin``, written by llama-server (``POST /slots/{id}?action=
save``), and ``NAME.tokens``, the prompt tokens it holds (little-endian 32-bit words), which the router
reads out of the ``.bin`` right after the save so that choosing a state never needs the big file.

The store is bounded (``kv_store_mib``): after every save the least recently used states go until the total
fits; restoring a state counts as a use. A new state makes every older state on its shelf whose tokens are a
prefix of its own redundant (the same conversation, earlier), and those go at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

__all__ = ["KvStore", "SavedState", "common_prefix", "shelf_name", "tokens_in_state_file"]

# Flags whose values do not change what a slot's KV state is: where the process listens and logs, and the
# size of its host-RAM cache.
_IRRELEVANT = frozenset(
    {"--port", "--host", "--slot-save-path", "--log-file", "-a", "--alias", "--cache-ram", "-cram"}
)
_STRAY_AGE = 600.0  # seconds after which a state file without its partner is a leftover, not a save underway
_MAX_HEADER_WORDS = 16  # the token count sits among the first few 32-bit words of a state file


def shelf_name(model: str, argv: Sequence[str]) -> str:
    """The shelf of a replica started with ``argv``: the model's name and a digest of its model file's
    identity (path, size, modification time) and every flag that could change the state's layout."""
    kept: list[str] = []
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg in _IRRELEVANT:
            skip = True
            continue
        kept.append(arg)
    identity: list[str] = []
    for flag in ("-m", "--model", "-md", "--model-draft", "-mm", "--mmproj"):
        if flag in argv[:-1]:
            path = Path(argv[argv.index(flag) + 1])
            try:
                info = path.stat()
            except OSError:
                identity.append(f"{path}:missing")
            else:
                identity.append(f"{path.resolve()}:{info.st_size}:{info.st_mtime_ns}")
    digest = hashlib.sha256("\0".join((*identity, *kept)).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[:48]
    return f"{safe}-{digest}"


def tokens_in_state_file(path: Path, n_tokens: int) -> list[int] | None:
    """The ``n_tokens`` prompt tokens a llama-server slot state file holds, or None when they cannot be
    found. The file starts with a magic word, a version and a few counts; the token ids follow the word that
    equals the number of tokens saved (which llama-server reports when it saves)."""
    want = 4 * (_MAX_HEADER_WORDS + n_tokens)
    try:
        with path.open("rb") as f:
            head = f.read(want)
    except OSError:
        return None
    words = len(head) // 4
    values = struct.unpack(f"<{words}I", head[: 4 * words])
    if words < 2 or n_tokens <= 0:
        return None
    for i in range(2, min(_MAX_HEADER_WORDS, words)):
        if values[i] == n_tokens and i + 1 + n_tokens <= words:
            return list(values[i + 1 : i + 1 + n_tokens])
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@attrs.frozen
class SavedState:
    """One saved slot state on a shelf."""

    shelf: Path
    name: str
    size: int  # bytes of both files
    used: float  # last save or restore (the files' modification time)

    @property
    def bin(self) -> Path:
        return self.shelf / f"{self.name}.bin"

    @property
    def tokens_path(self) -> Path:
        return self.shelf / f"{self.name}.tokens"

    def tokens(self) -> list[int] | None:
        try:
            data = self.tokens_path.read_bytes()
        except OSError:
            return None
        return list(struct.unpack(f"<{len(data) // 4}I", data[: 4 * (len(data) // 4)]))


@attrs.define
class KvStore:
    """The saved states under ``root``, at most ``cap_bytes`` in all."""

    root: Path
    cap_bytes: int

    def shelf(self, name: str) -> Path:
        """The folder of shelf ``name``, created when missing."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def new_name(replica: int, slot: int) -> str:
        return f"{time.time_ns()}-r{replica}-s{slot}"

    def states(self, shelf: Path) -> list[SavedState]:
        """The complete states on ``shelf`` (both files there), most recently used first."""
        try:
            entries = list(os.scandir(shelf))
        except OSError:
            return []
        stats: dict[tuple[str, str], os.stat_result] = {}
        for entry in entries:
            stem, dot, ext = entry.name.rpartition(".")
            if dot and ext in ("bin", "tokens"):
                with contextlib.suppress(OSError):
                    stats[(stem, ext)] = entry.stat()
        found = [
            SavedState(shelf, stem, info.st_size + stats[(stem, "tokens")].st_size, info.st_mtime)
            for (stem, ext), info in stats.items()
            if ext == "bin" and (stem, "tokens") in stats
        ]
        found.sort(key=lambda s: s.used, reverse=True)
        return found

    def keep(self, shelf: Path, name: str, n_tokens: int) -> list[int] | None:
        """Finish a save llama-server just wrote to ``shelf/name.bin``: write its tokens beside it, drop the
        states it makes redundant and trim the store to its cap. Returns the tokens (None: the state was
        empty or unreadable, and is gone)."""
        state_file = shelf / f"{name}.bin"
        tokens = tokens_in_state_file(state_file, n_tokens) if n_tokens > 0 else None
        if tokens is None:
            _remove(state_file)
            return None
        (shelf / f"{name}.tokens").write_bytes(struct.pack(f"<{len(tokens)}I", *tokens))
        for older in self.states(shelf):
            if older.name == name:
                continue
            held = older.tokens()
            if held is not None and len(held) <= len(tokens) and tokens[: len(held)] == held:
                self.forget(older)
        self.trim()
        return tokens

    def best(
        self, shelf: Path, prompt: Sequence[int] | None, min_tokens: int
    ) -> tuple[SavedState, int] | None:
        """The state sharing the longest prefix (at least ``min_tokens``) with ``prompt``, ties to the most
        recently used; with no prompt, the most recently used state (and 0)."""
        states = self.states(shelf)
        if prompt is None:
            return (states[0], 0) if states else None
        best: tuple[SavedState, int] | None = None
        for state in states:
            held = state.tokens()
            if held is None:
                continue
            shared = common_prefix(held, prompt)
            if shared >= min_tokens and (best is None or shared > best[1]):
                best = (state, shared)
        return best

    def touch(self, state: SavedState) -> None:
        """Count a restore as a use (least recently used states are trimmed first)."""
        now = time.time()
        for path in (state.bin, state.tokens_path):
            with contextlib.suppress(OSError):
                os.utime(path, (now, now))

    def forget(self, state: SavedState) -> None:
        _remove(state.bin)
        _remove(state.tokens_path)

    def all_states(self) -> list[SavedState]:
        """Every state in the store, most recently used first."""
        try:
            shelves = [Path(e.path) for e in os.scandir(self.root) if e.is_dir()]
        except OSError:
            return []
        states = [s for shelf in shelves for s in self.states(shelf)]
        states.sort(key=lambda s: s.used, reverse=True)
        return states

    def size(self) -> int:
        return sum(s.size for s in self.all_states())

    def trim(self) -> None:
        """Forget the least recently used states until the store fits its cap, and files left alone by a
        save that never finished (the router stopped, or gave up waiting) once they are old."""
        self._sweep_strays()
        states = self.all_states()
        total = sum(s.size for s in states)
        for state in reversed(states):
            if total <= self.cap_bytes:
                break
            self.forget(state)
            total -= state.size

    def _sweep_strays(self) -> None:
        cutoff = time.time() - _STRAY_AGE
        with contextlib.suppress(OSError):
            for shelf in os.scandir(self.root):
                if not shelf.is_dir():
                    continue
                names = set(os.listdir(shelf.path))
                for name in names:
                    stem, _, ext = name.rpartition(".")
                    partner = f"{stem}.tokens" if ext == "bin" else f"{stem}.bin"
                    if ext in ("bin", "tokens") and partner not in names:
                        path = Path(shelf.path) / name
                        with contextlib.suppress(OSError):
                            if path.stat().st_mtime < cutoff:
                                path.unlink()


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
