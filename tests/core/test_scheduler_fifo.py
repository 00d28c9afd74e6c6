"""The persistent request queue: order, removal from the middle, compaction of long-dead heads."""

from __future__ import annotations

from statemachine.fifo import _COMPACT_AT, Fifo


def test_a_long_queue_compacts_its_dead_head_and_keeps_its_order() -> None:
    total = 3 * _COMPACT_AT
    live = set(range(total))
    fifo = Fifo()
    for rid in range(total):
        fifo = fifo.push(rid)
    for rid in range(2 * _COMPACT_AT):  # take the head again and again, as dispatches do
        live.discard(rid)
        fifo = fifo.drop(rid, live.__contains__)
        assert fifo.first() == rid + 1
    assert fifo.head < _COMPACT_AT  # compacted on the way
    assert fifo.count == len(live) == _COMPACT_AT
    assert list(fifo.live(live.__contains__)) == sorted(live)
    live.discard(total - 5)  # and from the middle
    fifo = fifo.drop(total - 5, live.__contains__)
    assert list(fifo.live(live.__contains__)) == sorted(live) and fifo.count == len(live)
    live.add(0)  # a refused dispatch goes back to its arrival place
    fifo = fifo.insert(0, lambda rid: rid, live.__contains__)
    assert fifo.first() == 0 and list(fifo.live(live.__contains__)) == sorted(live)
