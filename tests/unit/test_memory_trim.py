"""Freed memory is handed back after a burst: glibc's malloc_trim is found and runs, and the router trims
only once requests were served and none is in flight."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from router.shell import memory_trim


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_trimming_gives_freed_heap_pages_back() -> None:
    trim = memory_trim.malloc_trim()
    assert trim is not None  # this machine's C library is glibc
    kept = []
    blocks = [bytearray(4000) for _ in range(40_000)]  # about 160 MB in the C heap, not in Python's arenas
    kept.append(blocks.pop())  # the last block holds the heap's top: only a trim frees the pages under it
    del blocks
    before = rss_kib()
    trim()
    assert rss_kib() < before - 100_000


async def test_it_trims_after_requests_and_only_when_none_is_in_flight(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    trims: list[float] = []
    monkeypatch.setattr(memory_trim, "malloc_trim", lambda: lambda: trims.append(trio.current_time()))
    served, busy = [0], [False]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(memory_trim.trim_when_idle, lambda: served[0], lambda: busy[0], 1.0)
        await trio.sleep(5.5)
        assert trims == []  # nothing served: nothing to give back
        served[0], busy[0] = 3, True
        await trio.sleep(2)
        assert trims == []  # requests in flight
        busy[0] = False
        await trio.sleep(1)
        assert len(trims) == 1
        await trio.sleep(5)
        assert len(trims) == 1  # once per burst
        nursery.cancel_scope.cancel()
