"""Who is served first: the rank by which the scheduling pass takes waiting requests (spec §4, INV-CLASS,
INV-FAIR, INV-AGED).

Only each lane's head is ranked (a lane: one key's requests of one class for one target, in arrival order).
A head's rank, lowest first:

1. ``(0, 0, seq)`` once it has waited its class's maximum wait (``Policy.max_wait``): aged requests go
   before every class, oldest first, so none starves;
2. otherwise ``(1 + class, tag, seq)``: by class, then by its key's start tag (fair share), then by arrival.

Fair share is start-time fair queueing over dispatches. Each key has a start tag ``fair[key]`` (the virtual
time its next dispatch starts at), and the scheduler a virtual clock ``vclock`` (the latest start so far).
A dispatch of the key's request starts at its tag, moves the clock up to it and the tag on by ``1 / weight``.
A key that had nothing waiting starts again at ``max(fair[key], vclock)`` when a request of it arrives, so it
re-enters at the clock instead of claiming the service it did not use. Two keys of one class that both keep
requests waiting for the same capacity are therefore served in proportion to their weights, within one
request of each; one key's requests, wherever they wait, share one tag, so they keep their arrival order.

A key's tag changes only when its own request is dispatched (it grows) or when it starts waiting again (it has
no heads then): a head's rank never falls while it waits, which ``statemachine.heads`` relies on.
"""

from __future__ import annotations

from pyrsistent.typing import PMap

from .classes import RequestClass
from .settings import Policy
from .state import Request

Rank = tuple[int, float, int]


class FairShare:
    """The keys' start tags and the virtual clock during one step: each tag read from the state's map once,
    those this step moved kept apart (``served`` counts the dispatches, so a rank computed before one can be
    told stale)."""

    def __init__(self, base: PMap[str, float], vclock: float) -> None:
        self.base = base
        self.vclock = vclock
        self.read: dict[str, float] = {}
        self.moved: dict[str, float] = {}
        self.served = 0

    def tag(self, key: str) -> float:
        tag = self.read.get(key)
        if tag is None:
            tag = self.read[key] = self.base.get(key, 0.0)
        return tag

    def waits_again(self, key: str) -> None:
        """``key``, which had no request waiting, has one: it starts at the clock if it lags behind."""
        if self.tag(key) < self.vclock:
            self.read[key] = self.moved[key] = self.vclock

    def serve(self, key: str, weight: float) -> None:
        """A dispatch of ``key``'s request starts at its tag: the clock moves up to it, the tag on by
        ``1 / weight``."""
        start = self.tag(key)
        self.vclock = max(self.vclock, start)
        self.read[key] = self.moved[key] = start + 1.0 / weight
        self.served += 1

    def persistent(self) -> PMap[str, float]:
        return self.base.update(self.moved) if self.moved else self.base


def aged(policy: Policy, request: Request, now: float) -> bool:
    """Whether ``request`` has waited its class's maximum wait."""
    return now >= request.arrived + policy.max_wait[request.klass]


def rank(policy: Policy, fair: FairShare, request: Request, now: float) -> Rank:
    """The rank of a lane's head."""
    if aged(policy, request, now):
        return (0, 0.0, request.seq)
    return (1 + request.klass, fair.tag(request.key), request.seq)


def claim_time(policy: Policy, request: Request) -> float:
    """From when a request that needs a swap holds its GPUs against the requests ranked after it: an
    interactive one at once, any other after the head grace or its class's maximum wait (the earlier)."""
    if request.klass == RequestClass.INTERACTIVE:
        return request.arrived
    return request.arrived + min(policy.claim_after, policy.max_wait[request.klass])
