"""The rule for a dispatch that never reached its replica."""

from __future__ import annotations

import attrs

from .errors import IllegalEvent
from .events import DispatchFailed
from .state import INFLIGHT, QUEUED, STOPPING
from .work import Work


def dispatch_failed(w: Work, e: DispatchFailed) -> None:
    """The replica refused the connection (it is gone or going): the request waits again in its place and
    the replica takes no more work; its exit, reported separately, frees it."""
    request = w.request(e.rid)
    if request is None or request.phase != INFLIGHT or request.replica is None:
        raise IllegalEvent(f"DispatchFailed for request {e.rid}, which is not in flight")
    replica = w.replicas[request.replica]
    w.release(request)
    waiting = attrs.evolve(request, phase=QUEUED, replica=None, model=None)
    w.requests[waiting.rid] = waiting
    w.queues[waiting.target] = w.fifo(waiting.target).insert(
        waiting.rid, lambda rid: w.requests[rid].seq, w.is_queued
    )
    w.waiting += 1
    current = w.replicas[replica.id]
    if current.phase != STOPPING and not current.draining:
        w.put(attrs.evolve(current, draining=True))
