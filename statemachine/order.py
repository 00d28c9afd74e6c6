"""Who is served first: the rank by which the scheduling pass takes waiting requests (spec §4, INV-CLASS,
INV-FAIR, INV-AGED).

A request's rank, lowest first:

1. ``(0, 0, seq)`` once it has waited its class's maximum wait (``Policy.max_wait``): aged requests go
   before every class, oldest first, so none starves;
2. otherwise ``(1 + class, tag, seq)``: by class, then by its key's fair-share tag, then by arrival.

Fair share is start-time fair queueing over dispatches: each key has a finish tag ``fair[key]``, and the
scheduler a virtual clock ``vclock`` (the start tag of the latest dispatch). A key's tag is
``max(fair[key], vclock)``, so a key that was idle re-enters at the clock instead of claiming the service it
did not use; each dispatch of its requests starts at that tag and moves its finish tag on by
``1 / weight``. Two keys of one class that both keep requests waiting for the same capacity are therefore
served in proportion to their weights, within one request of each.
"""

from __future__ import annotations

from pyrsistent.typing import PMap

from .classes import RequestClass
from .settings import Policy
from .state import Request

Rank = tuple[int, float, int]


class FairShare:
    """The keys' finish tags and the virtual clock during one step: each tag read from the state's map once,
    those this step moved kept apart (``served`` counts the moves, so a rank computed before one can be
    told stale)."""

    def __init__(self, base: PMap[str, float], vclock: float) -> None:
        self.base = base
        self.vclock = vclock
        self.read: dict[str, float] = {}
        self.moved: dict[str, float] = {}
        self.served = 0

    def tag(self, key: str) -> float:
        """``key``'s start tag if it were served now: its finish tag, or the clock if it lags behind."""
        tag = self.read.get(key)
        if tag is None:
            tag = self.read[key] = self.base.get(key, 0.0)
        return max(tag, self.vclock)

    def serve(self, key: str, weight: float) -> None:
        """A dispatch of ``key``'s request starts at its tag, moves its finish tag on by ``1 / weight`` and
        the clock to that start."""
        start = self.tag(key)
        self.read[key] = self.moved[key] = start + 1.0 / weight
        self.vclock = start
        self.served += 1

    def persistent(self) -> PMap[str, float]:
        return self.base.update(self.moved) if self.moved else self.base


def aged(policy: Policy, request: Request, now: float) -> bool:
    """Whether ``request`` has waited its class's maximum wait."""
    return now >= request.arrived + policy.max_wait[request.klass]


def rank(policy: Policy, fair: FairShare, request: Request, now: float) -> Rank:
    if aged(policy, request, now):
        return (0, 0.0, request.seq)
    return (1 + request.klass, fair.tag(request.key), request.seq)


def claim_time(policy: Policy, request: Request) -> float:
    """From when a request that needs a swap holds its GPUs against the requests ranked after it: an
    interactive one at once, any other after the head grace or its class's maximum wait (the earlier)."""
    if request.klass == RequestClass.INTERACTIVE:
        return request.arrived
    return request.arrived + min(policy.claim_after, policy.max_wait[request.klass])
