"""The requests waiting for one target, in lanes: one first-in-first-out lane per (class, key).

Within a lane, requests keep their arrival order, and they age in that order too (one class, one maximum
wait), so a lane's head is always the first of its lane to be served; the scheduling pass compares only the
lanes' heads (see ``statemachine.order``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
from pyrsistent import pmap
from pyrsistent.typing import PMap

from .fifo import Fifo

Lane = tuple[int, str]  # (the request's class, its key's name)


@attrs.frozen
class TargetQueue:
    lanes: PMap[Lane, Fifo] = attrs.field(factory=pmap)
    count: int = 0

    def push(self, lane: Lane, rid: int) -> TargetQueue:
        return TargetQueue(self.lanes.set(lane, self.lanes.get(lane, _EMPTY).push(rid)), self.count + 1)

    def drop(self, lane: Lane, rid: int, is_live: Callable[[int], bool]) -> TargetQueue:
        """Forget ``rid`` (already marked dead by the caller); a lane left empty goes."""
        fifo = self.lanes[lane].drop(rid, is_live)
        lanes = self.lanes.set(lane, fifo) if fifo.count else self.lanes.remove(lane)
        return TargetQueue(lanes, self.count - 1)

    def insert(
        self, lane: Lane, rid: int, seq_of: Callable[[int], int], is_live: Callable[[int], bool]
    ) -> TargetQueue:
        """Put ``rid`` back at its arrival place in its lane."""
        fifo = self.lanes.get(lane, _EMPTY).insert(rid, seq_of, is_live)
        return TargetQueue(self.lanes.set(lane, fifo), self.count + 1)

    def head(self, lane: Lane) -> int | None:
        fifo = self.lanes.get(lane)
        return None if fifo is None else fifo.first()

    def heads(self) -> Iterator[int]:
        for fifo in self.lanes.values():
            head = fifo.first()
            if head is not None:
                yield head

    def live(self, is_live: Callable[[int], bool]) -> Iterator[int]:
        """Every waiting request, lane by lane (not in arrival order across lanes)."""
        for fifo in self.lanes.values():
            yield from fifo.live(is_live)


_EMPTY = Fifo()
EMPTY_QUEUE = TargetQueue()
