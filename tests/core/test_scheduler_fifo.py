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


def test_taking_the_head_skips_every_id_that_left_from_the_middle() -> None:
    live = {1, 2, 3, 4, 5}
    fifo = Fifo()
    for rid in sorted(live):
        fifo = fifo.push(rid)
    for rid in (2, 3):  # two requests behind the head leave (clients gone)
        live.discard(rid)
        fifo = fifo.drop(rid, live.__contains__)
        assert fifo.first() == 1
    live.discard(1)
    fifo = fifo.drop(1, live.__contains__)
    assert fifo.first() == 4 and fifo.count == 2 and list(fifo.live(live.__contains__)) == [4, 5]


def test_a_request_put_back_goes_to_its_own_arrival_place() -> None:
    seq = {rid: rid * 10 for rid in range(1, 8)}
    live = {1, 3, 5, 7}
    fifo = Fifo()
    for rid in sorted(live):
        fifo = fifo.push(rid)
    for rid, expected in ((4, [1, 3, 4, 5, 7]), (6, [1, 3, 4, 5, 6, 7]), (2, [1, 2, 3, 4, 5, 6, 7])):
        live.add(rid)
        fifo = fifo.insert(rid, seq.__getitem__, live.__contains__)
        assert list(fifo.live(live.__contains__)) == expected and fifo.count == len(expected)
    assert fifo.first() == 1
