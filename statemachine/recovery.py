"""The rules for work that never reached where it was sent: a refused dispatch, a failed peer."""

from __future__ import annotations

import attrs

from .commands import Reject, RejectCode
from .errors import IllegalEvent
from .events import DispatchFailed, PeerFailed, PeerState
from .passes import candidates
from .state import INFLIGHT, QUEUED, STOPPING, Request
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
            w.reject(request, RejectCode.SHUTTING_DOWN, "the router is shutting down; retry shortly")
        else:
            message = (
                f"'{request.target}' was removed from the configuration and its replica refused the request"
            )
            w.reject(request, RejectCode.MODEL_NOT_FOUND, message)
        _drain(w, replica.id)
        return
    w.release(request)
    _wait_again(w, attrs.evolve(request, phase=QUEUED, replica=None, model=None, overflow=False))
    _drain(w, replica.id)


def _wait_again(w: Work, waiting: Request) -> None:
    """It was admitted already: it waits in its arrival place, like any other request (never as an overflow
    to refuse)."""
    w.requeue(waiting)


def peer_failed(w: Work, e: PeerFailed) -> None:
    """The peer failed the request before its client got a byte: a pooled request waits again for its other
    members (this one is never tried again for it); any other is answered with the peer's failure."""
    request = w.request(e.rid)
    if request is None or request.phase != INFLIGHT or request.peer is None or request.model is None:
        raise IllegalEvent(f"PeerFailed for request {e.rid}, which is not forwarded to a peer")
    peer, model = request.peer, request.model
    w.release(request)
    if e.down and peer in w.settings.peers:
        w.peers_down[peer] = e.reason
    if w.shutting_down:
        w.cmds.append(Reject(e.rid, RejectCode.SHUTTING_DOWN, "the router is shutting down; retry shortly"))
        return
    avoid = request.avoid | {model}
    known = request.target in w.settings.models or request.target in w.settings.pools
    if known and candidates(
        w, request.target, request.tokens, avoid, request.local_only, outside=request.outside
    ):
        waiting = attrs.evolve(request, phase=QUEUED, peer=None, model=None, overflow=False, avoid=avoid)
        _wait_again(w, waiting)
        return
    code = RejectCode.PEER_UNREACHABLE if e.down else RejectCode.PEER_FAILED
    message = f"peer '{peer}' serving '{model}' failed: {e.reason}"
    w.cmds.append(Reject(e.rid, code, message, peer_status=e.status))


def peer_state(w: Work, e: PeerState) -> None:
    """A peer's probe: a peer reported down is skipped until it is reported up (unknown peers: no change)."""
    if e.up:
        if e.peer in w.peers_down:
            del w.peers_down[e.peer]
    elif e.peer in w.settings.peers:
        w.peers_down[e.peer] = e.reason or "not answering"


def _drain(w: Work, replica_id: int) -> None:
    current = w.replicas[replica_id]
    if current.phase != STOPPING and not current.draining:
        w.put(attrs.evolve(current, draining=True))
