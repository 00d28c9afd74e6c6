"""The saved-state store on disk: reading tokens out of state files, choosing a state, forgetting old ones."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from router.shell.kv_store import KvStore, common_prefix, shelf_name, tokens_in_state_file


def real_layout(tokens: list[int]) -> bytes:
    """A state file as llama-server b11434 writes it (magic, version 4, word count, a marker, a chunk
    count, the token count, the tokens, then the KV data)."""
    words = [0x67677371, 4, len(tokens) + 4, 0xFFFFFFFF, 1, len(tokens), *tokens, 0]
    return struct.pack(f"<{len(words)}I", *words) + b"\x01" * 256


def save(store: KvStore, shelf: Path, tokens: list[int], *, at: float | None = None) -> str:
    """What a save does: llama-server writes the .bin, the router keeps it."""
    name = store.new_name(1, 0)
    (shelf / f"{name}.bin").write_bytes(real_layout(tokens))
    assert store.keep(shelf, name, len(tokens)) == tokens
    if at is not None:
        for suffix in (".bin", ".tokens"):
            os.utime(shelf / f"{name}{suffix}", (at, at))
    return name


def test_tokens_come_out_of_a_state_file(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(real_layout([1, 529, 29989, 3]))
    assert tokens_in_state_file(path, 4) == [1, 529, 29989, 3]
    assert tokens_in_state_file(path, 5) is None  # the count llama-server reported is not in the header
    path.write_bytes(b"nonsense")
    assert tokens_in_state_file(path, 4) is None
    assert tokens_in_state_file(tmp_path / "missing.bin", 4) is None


def test_an_empty_or_unreadable_save_leaves_nothing(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30)
    shelf = store.shelf("m-1")
    (shelf / "x.bin").write_bytes(real_layout([]))
    assert store.keep(shelf, "x", 0) is None
    (shelf / "y.bin").write_bytes(b"garbage")
    assert store.keep(shelf, "y", 10) is None
    assert list(shelf.iterdir()) == []


def test_a_later_turn_replaces_the_earlier_one(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30)
    shelf = store.shelf("m-1")
    save(store, shelf, [1, 2, 3])
    other = save(store, shelf, [1, 2, 9])
    latest = save(store, shelf, [1, 2, 3, 4, 5])
    assert sorted(s.name for s in store.states(shelf)) == sorted([other, latest])


def test_the_longest_shared_prefix_wins_and_small_ones_do_not_count(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30)
    shelf = store.shelf("m-1")
    now = time.time()
    a = save(store, shelf, [1, 2, 3, 4, 5, 6], at=now - 30)
    b = save(store, shelf, [1, 2, 3, 7, 8], at=now - 20)
    c = save(store, shelf, [1, 2, 3, 7, 9], at=now - 10)
    best = store.best(shelf, [1, 2, 3, 4, 5, 0], 2)
    assert best is not None and (best[0].name, best[1]) == (a, 5)
    best = store.best(shelf, [1, 2, 3, 7, 0], 2)
    assert best is not None and (best[0].name, best[1]) == (c, 4)  # b ties; c is the more recent
    assert store.best(shelf, [1, 2, 3, 7, 0], 5) is None
    assert store.best(shelf, [9, 9], 1) is None
    latest = store.best(shelf, None, 100)
    assert latest is not None and latest[0].name == c
    store.touch(next(s for s in store.states(shelf) if s.name == b))
    latest = store.best(shelf, None, 100)
    assert latest is not None and latest[0].name == b  # a restore counts as a use


def test_the_store_keeps_within_its_cap_least_recently_used_first(tmp_path: Path) -> None:
    one = len(real_layout(list(range(100)))) + 400
    store = KvStore(tmp_path, 2 * one + 10)
    now = time.time()
    old = save(store, store.shelf("m-1"), list(range(100)), at=now - 30)
    mid = save(store, store.shelf("n-2"), list(range(1000, 1100)), at=now - 20)
    assert store.size() == 2 * one
    new = save(store, store.shelf("m-1"), list(range(2000, 2100)))
    assert {s.name for s in store.all_states()} == {mid, new}
    assert old not in {s.name for s in store.all_states()}
    assert store.size() <= store.cap_bytes


def test_leftovers_of_unfinished_saves_go_once_old(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30)
    shelf = store.shelf("m-1")
    stale, fresh = shelf / "1-r1-s0.bin", shelf / "2-r1-s0.bin"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"being written")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    store.trim()
    assert not stale.exists() and fresh.exists()


def test_a_shelf_names_the_model_file_and_the_flags_that_shape_the_state(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF one")
    argv = [
        "llama-server",
        "-m",
        str(model),
        "-c",
        "4096",
        "-np",
        "2",
        "--port",
        "1234",
        "--host",
        "127.0.0.1",
    ]
    name = shelf_name("m", argv)
    assert name.startswith("m-")
    assert shelf_name("m", [*argv[:-4], "--port", "999", "--host", "0.0.0.0"]) == name
    assert shelf_name("m", [*argv, "--alias", "other"]) == name
    assert shelf_name("m", [*argv, "--cache-ram", "512"]) == name
    assert shelf_name("m", [*argv, "-ctk", "q8_0"]) != name
    assert shelf_name("m", [a if a != "4096" else "8192" for a in argv]) != name
    model.write_bytes(b"GGUF two, a new download")
    assert shelf_name("m", argv) != name
    assert shelf_name("my/model:Q4", argv).startswith("my_model_Q4-")


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2
