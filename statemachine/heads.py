"""The first-ranked head of each target's lanes, found without looking at every lane on every step.

A head's rank (``statemachine.order``) never falls while it waits: its key's tag only grows, and aging only
moves it forward with the clock. So each target keeps, per class, two heaps over its lanes' heads: by (tag,
seq) for the class's own order and by seq for aging (the oldest head of a class is the first of it to age).
An entry carries the tag its key had when it was pushed, which can only be lower than the tag now: an entry
at the top whose key has moved on is pushed again with the current tag, and one whose request is no longer
its lane's head is dropped, until the top is current — then it is the least of all. The best head is
remembered until the target's queue or the policy changes, the best head's key is served, or the clock
reaches the next head's aging.

``HeadIndex`` is a cache, never part of the state's value. It follows one line of states: it is used only
by a step from the state it was last left in (``owner``, checked by identity), and each target's heaps only
for the queue object they were built for; a step from any other state starts a new index. The answers are
the same whether the cache was used or not.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping

from .classes import RequestClass
from .lanes import TargetQueue
from .order import FairShare, Rank
from .settings import Policy
from .state import Request

_CLASSES = len(RequestClass)
_SLACK = 64  # entries a target's heaps may hold beyond four per lane before they are built again


class Memo:
    """A target's best head as last found (``best``), under ``policy``, while its key's tag is ``tag`` and
    the clock is before ``until`` (the next head's aging)."""

    __slots__ = ("best", "policy", "tag", "until")

    def __init__(self, best: tuple[Rank, Request], policy: Policy, tag: float, until: float) -> None:
        self.best, self.policy, self.tag, self.until = best, policy, tag, until


class TargetHeads:
    """The heaps of one target's lane heads, and its best head as last found."""

    __slots__ = ("by_seq", "by_tag", "memo", "queue")

    def __init__(self, queue: TargetQueue, requests: Mapping[int, Request], fair: FairShare) -> None:
        self.queue = queue
        self.by_tag: list[list[tuple[float, int, int]]] = [[] for _ in range(_CLASSES)]
        self.by_seq: list[list[tuple[int, int]]] = [[] for _ in range(_CLASSES)]
        for (klass, key), fifo in queue.lanes.items():
            rid = fifo.first()
            if rid is not None:
                seq = requests[rid].seq
                self.by_tag[klass].append((fair.tag(key), seq, rid))
                self.by_seq[klass].append((seq, rid))
        for heap in (*self.by_tag, *self.by_seq):
            heapq.heapify(heap)
        self.memo: Memo | None = None

    def moved(self, queue: TargetQueue, head: Request | None, fair: FairShare) -> None:
        """``queue`` replaces the one these heaps were for; one lane has a new head (``head``) or none."""
        self.queue = queue
        self.memo = None
        if head is not None:
            heapq.heappush(self.by_tag[head.klass], (fair.tag(head.key), head.seq, head.rid))
            heapq.heappush(self.by_seq[head.klass], (head.seq, head.rid))

    def kept(self, queue: TargetQueue) -> None:
        """``queue`` replaces the one these heaps were for, with the same heads (and so the same best)."""
        self.queue = queue

    def oversized(self) -> bool:
        return sum(len(h) for h in self.by_tag) > 4 * len(self.queue.lanes) + _SLACK

    def _is_head(self, rid: int, requests: Mapping[int, Request]) -> bool:
        return rid in requests and self.queue.head(requests[rid].lane) == rid

    def best(
        self, requests: Mapping[int, Request], policy: Policy, now: float, fair: FairShare
    ) -> tuple[Rank, Request]:
        """The first-ranked head (the target's queue is never empty)."""
        memo = self.memo
        if (
            memo is not None
            and now < memo.until
            and policy is memo.policy
            and fair.tag(memo.best[1].key) == memo.tag
        ):
            return memo.best
        best: tuple[Rank, Request] | None = None
        next_aging = math.inf
        for klass in range(_CLASSES):
            by_seq = self.by_seq[klass]
            while by_seq and not self._is_head(by_seq[0][1], requests):
                heapq.heappop(by_seq)
            if not by_seq:
                continue
            oldest = requests[by_seq[0][1]]
            ages_at = oldest.arrived + policy.max_wait[klass]
            if now >= ages_at:
                rank: Rank = (0, 0.0, oldest.seq)
                if best is None or rank < best[0]:
                    best = (rank, oldest)
                continue
            next_aging = min(next_aging, ages_at)
            by_tag = self.by_tag[klass]
            while True:  # a live head is in it: this ends before the heap is empty
                tag, seq, rid = by_tag[0]
                if not self._is_head(rid, requests):
                    heapq.heappop(by_tag)
                    continue
                now_tag = fair.tag(requests[rid].key)
                if now_tag == tag:
                    break
                heapq.heapreplace(by_tag, (now_tag, seq, rid))  # its key was served since: a later rank
            rank = (1 + klass, tag, seq)
            if best is None or rank < best[0]:
                best = (rank, requests[rid])
        assert best is not None, "a target's queue with no head"
        self.memo = Memo(best, policy, fair.tag(best[1].key), next_aging)
        return best


class HeadIndex:
    """Every target's ``TargetHeads``, for the state ``owner`` (see the module's doc)."""

    __slots__ = ("owner", "targets")
    owner: object  # set as the step that made the index ends: the state it was left in

    def __init__(self) -> None:
        self.targets: dict[str, TargetHeads] = {}

    def of(
        self, target: str, queue: TargetQueue, requests: Mapping[int, Request], fair: FairShare
    ) -> TargetHeads:
        heads = self.targets.get(target)
        if heads is None or heads.queue is not queue or heads.oversized():
            heads = self.targets[target] = TargetHeads(queue, requests, fair)
        return heads

    def following(self, target: str, old: TargetQueue) -> TargetHeads | None:
        """The heads of ``target`` if they are those of the queue object ``old`` (else None: built again
        when next needed)."""
        heads = self.targets.get(target)
        return heads if heads is not None and heads.queue is old else None
