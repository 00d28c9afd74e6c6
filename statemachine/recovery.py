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
    known = request.target in w.settings.models or request.target in w.settings.pools
    if w.shutting_down or not known:
        # It cannot wait again: the router is stopping, or a reload removed what it asked for.
        if w.shutting_down:
            w.reject(request, 503, "shutting_down", "the router is shutting down; retry shortly")
        else:
            message = (
                f"'{request.target}' was removed from the configuration and its replica refused the request"
            )
            w.reject(request, 404, "model_not_found", message)
        _drain(w, replica.id)
        return
    w.release(request)
    # It was admitted already: it waits like any other request (never as an overflow to refuse).
    waiting = attrs.evolve(request, phase=QUEUED, replica=None, model=None, overflow=False)
    w.requests[waiting.rid] = waiting
    w.queues[waiting.target] = w.fifo(waiting.target).insert(
        waiting.rid, lambda rid: w.requests[rid].seq, w.is_queued
    )
    w.waiting += 1
    _drain(w, replica.id)


def _drain(w: Work, replica_id: int) -> None:
    current = w.replicas[replica_id]
    if current.phase != STOPPING and not current.draining:
        w.put(attrs.evolve(current, draining=True))
