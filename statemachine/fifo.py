"""A persistent first-in-first-out queue of request ids with removal from the middle.

Appending and taking the head are cheap whatever the length; a removed id stays in the vector until it
reaches the head, where it is skipped. ``count`` is the number of live ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
from pyrsistent import pvector
from pyrsistent.typing import PVector

_COMPACT_AT = 1024


@attrs.frozen
class Fifo:
    items: PVector[int] = attrs.field(factory=pvector)
    head: int = 0
    count: int = 0

    def push(self, rid: int) -> Fifo:
        return Fifo(self.items.append(rid), self.head, self.count + 1)

    def first(self) -> int | None:
        """The live head (the caller keeps the head live by calling ``drop`` on every removal)."""
        return self.items[self.head] if self.count else None

    def drop(self, rid: int, is_live: Callable[[int], bool]) -> Fifo:
        """Forget ``rid`` (already marked dead by the caller) and advance past dead ids at the head."""
        head = self.head
        count = self.count - 1
        items = self.items
        if count == 0:
            return Fifo()
        if items[head] == rid:
            head += 1
            while not is_live(items[head]):
                head += 1
        if head >= _COMPACT_AT and head * 2 >= len(items):
            items = pvector(items[head:])
            head = 0
        return Fifo(items, head, count)

    def live(self, is_live: Callable[[int], bool]) -> Iterator[int]:
        for i in range(self.head, len(self.items)):
            rid = self.items[i]
            if is_live(rid):
                yield rid

    def insert(self, rid: int, seq_of: Callable[[int], int], is_live: Callable[[int], bool]) -> Fifo:
        """Put ``rid`` back at its arrival position (rare: a dispatch that never reached its replica)."""
        live = list(self.live(is_live))
        position = 0
        while position < len(live) and seq_of(live[position]) < seq_of(rid):
            position += 1
        live.insert(position, rid)
        return Fifo(pvector(live), 0, len(live))
