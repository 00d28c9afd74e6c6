"""Scheduler scenarios: the answer every peer-related situation gets, and what a request does after a peer
failed it.

- a request from another router (``local_only``) is answered ``508 loop_detected`` only when peer models
  are all that could serve it; one that loses its local candidates gets ``503 model_unavailable``;
- every code a request may get because of peers: ``508 loop_detected``, ``502 peer_failed`` (a peer failed
  it and nothing else is left), ``503 model_unavailable`` (its peers are down), and the status a
  ``PeerFailed`` carries passed on with ``peer_unreachable`` or ``peer_failed``;
- after ``PeerFailed``: a direct request is answered, a pooled one waits again for what is left, and one
  whose model or pool a reload removed while it was at the peer is answered with the peer's failure;
  while shutting down it is answered ``shutting_down``; for a request no peer holds it is illegal;
- a pool with no member yet (its peer models join once their peer answers) is answered 503; a pool whose
  peer member is full loads its local one; a reload forgets only the removed peers' down marks.

Each scenario here was written against a mutant of ``scripts/mutate_statemachine.py`` that survived the
pure tiers before it (issue 31).

``near`` runs here on GPU 0 (loaded at startup); ``far`` is served by peer ``box``, ``wide`` by peer
``cloud`` (one request at a time); pool ``auto`` tries ``near`` then ``far``, pool ``both`` ``far`` then
``wide``.
"""

from __future__ import annotations

import pytest

from statemachine import (
    Dispatch,
    Forward,
    IllegalEvent,
    ModelSpec,
    PeerFailed,
    PeerSpec,
    PeerState,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Spawn,
    Startup,
    Stopped,
    WakeAt,
    initial_state,
    run,
    step,
)
from tests.support.scenario import play

NOBODY = "no model can serve this request"


def _settings(near: ModelSpec | None = None) -> Settings:
    return Settings(
        models=[
            near or ModelSpec("near", load_on_startup=True),
            ModelSpec("far", gpus=(), peer="box"),
            ModelSpec("wide", gpus=(), peer="cloud"),
        ],
        pools=[
            PoolSpec("auto", ("near", "far"), fallback=True),
            PoolSpec("both", ("far", "wide"), fallback=True),
        ],
        peers=[PeerSpec("box", max_in_flight=2), PeerSpec("cloud", max_in_flight=1)],
    )


_READY = [(Startup(), [Spawn(1, "near", (0,), "load on startup")]), (ReplicaReady(1), [])]


def _loop(target: str) -> str:
    return (
        f"'{target}' is served by another router here, and this request was forwarded by a router "
        "already; it is not forwarded a second time, so that two routers that peer with each other cannot "
        "pass it back and forth. Send it to the router that serves the model itself"
    )


def _failed(model: str, reason: str, peer: str = "box") -> str:
    return f"peer '{peer}' serving '{model}' failed: {reason}"


# ------------------------------------------------------------------------------------ local-only requests
def test_a_local_only_request_is_refused_as_a_loop_only_when_peers_are_all_that_could_serve_it() -> None:
    # checks: INV-HOP, INV-UNSERVABLE
    refused = _settings(ModelSpec("near", load_on_startup=True, refusal="near no longer fits GPU 0"))
    play(
        _settings(),
        [
            *_READY,
            # On arrival: with a peer model only, 508; with a local candidate, it is served here.
            (RequestArrived(1, "far", local_only=True), [Reject(1, RejectCode.LOOP_DETECTED, _loop("far"))]),
            (
                RequestArrived(2, "both", local_only=True),
                [Reject(2, RejectCode.LOOP_DETECTED, _loop("both"))],
            ),
            (RequestArrived(3, "near", local_only=True), [Dispatch(3, 1, "near")]),
            (RequestArrived(4, "near", local_only=True), []),
            (RequestArrived(5, "near"), []),
            (RequestArrived(6, "auto", local_only=True), []),
            (RequestArrived(7, "auto"), []),
            # A reload leaves near refused: the waiting requests lose their local candidate. Those with no
            # peer model behind their target get 503, whether they came from a router or not; the pooled one
            # from a router has only the peer left (508); the pooled one from a client goes to the peer.
            (
                SettingsChanged(refused),
                [
                    Reject(4, RejectCode.MODEL_UNAVAILABLE, NOBODY),
                    Reject(5, RejectCode.MODEL_UNAVAILABLE, NOBODY),
                    Reject(6, RejectCode.LOOP_DETECTED, _loop("auto")),
                    Forward(7, "box", "far"),
                ],
            ),
        ],
    )


def test_a_local_only_request_waits_for_its_local_member_while_a_peer_member_is_free() -> None:
    # checks: INV-HOP
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "auto", local_only=True), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "auto", local_only=True), []),  # far's peer is free, yet 2 waits for near
            (RequestArrived(3, "far"), [Forward(3, "box", "far")]),
            (RequestFinished(1), [Dispatch(2, 1, "near")]),
        ],
    )


# ------------------------------------------------------------------------------------- every answer code
def test_a_pooled_request_a_peer_failed_is_answered_502_once_its_other_peer_goes_down() -> None:
    # checks: INV-PEER-FALLBACK, INV-PEER-DOWN
    play(
        _settings(),
        [
            (RequestArrived(1, "wide"), [Forward(1, "cloud", "wide")]),
            (RequestArrived(2, "both"), [Forward(2, "box", "far")]),
            (RequestArrived(3, "both"), [Forward(3, "box", "far")]),
            # far failed 2: it waits for wide, whose peer is at its limit.
            (PeerFailed(2, "answered 503: busy", status=503), []),
            # wide's peer goes down: 2 has nothing left and a peer failed it (502); 3, still at far, stays.
            (
                PeerState("cloud", up=False, reason="no answer within 5 s"),
                [
                    Reject(
                        2, RejectCode.PEER_FAILED, "the peer serving 'far' failed this request; retry later"
                    )
                ],
            ),
            (RequestFinished(3), []),
        ],
    )


def test_a_pooled_request_whose_peers_are_down_is_answered_503_and_one_a_peer_failed_502() -> None:
    # checks: INV-PEER-DOWN, INV-PEER-FALLBACK
    down = (
        "peer 'box' serving 'far' is down (connection refused); peer 'cloud' serving 'wide' is down "
        "(no answer); retry once it is back, or ask for a model served here"
    )
    play(
        _settings(),
        [
            (RequestArrived(1, "wide"), [Forward(1, "cloud", "wide")]),
            (RequestArrived(2, "both"), [Forward(2, "box", "far")]),
            (RequestArrived(3, "both"), [Forward(3, "box", "far")]),
            (RequestArrived(4, "both"), []),  # both peers are at their limits
            # far failed 2 and then 3 (its peer is down now): both wait for wide, in their places before 4.
            (PeerFailed(2, "answered 500: boom", status=500), []),
            (PeerFailed(3, "connection refused", down=True), []),
            # wide's peer goes down too: 2 and 3, which a peer failed, get 502; 4 gets 503 (peers down).
            (
                PeerState("cloud", up=False, reason="no answer"),
                [
                    Reject(
                        2, RejectCode.PEER_FAILED, "the peer serving 'far' failed this request; retry later"
                    ),
                    Reject(
                        3, RejectCode.PEER_FAILED, "the peer serving 'far' failed this request; retry later"
                    ),
                    Reject(4, RejectCode.MODEL_UNAVAILABLE, down),
                ],
            ),
            (RequestArrived(5, "both"), [Reject(5, RejectCode.MODEL_UNAVAILABLE, down)]),
        ],
    )


@pytest.mark.parametrize(
    ("status", "down", "code"),
    [
        (None, True, RejectCode.PEER_UNREACHABLE),
        (None, False, RejectCode.PEER_FAILED),
        (503, True, RejectCode.PEER_UNREACHABLE),
        (500, False, RejectCode.PEER_FAILED),
        (429, False, RejectCode.PEER_FAILED),
    ],
)
def test_a_direct_request_a_peer_failed_gets_the_peers_failure_and_status(
    status: int | None, down: bool, code: RejectCode
) -> None:
    # checks: INV-PEER-FALLBACK (the status answered for peer_status is router.http.errors' choice)
    play(
        _settings(),
        [
            (RequestArrived(1, "far"), [Forward(1, "box", "far")]),
            (
                PeerFailed(1, "it said no", down=down, status=status),
                [Reject(1, code, _failed("far", "it said no"), peer_status=status)],
            ),
        ],
    )


# ----------------------------------------------------------------------- after a peer failure: who retries
def test_after_a_peer_failure_a_model_is_answered_and_a_pool_falls_back_in_its_place() -> None:
    # checks: INV-PEER-FALLBACK
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "near"), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "far"), [Forward(2, "box", "far")]),
            (RequestArrived(3, "auto"), [Forward(3, "box", "far")]),
            (RequestArrived(4, "near"), []),
            # The direct request is answered; the pooled one waits for near, ahead of 4 (it came first).
            (
                PeerFailed(2, "answered 502", status=502),
                [Reject(2, RejectCode.PEER_FAILED, _failed("far", "answered 502"), peer_status=502)],
            ),
            (PeerFailed(3, "answered 503", status=503), []),
            (RequestFinished(1), [Dispatch(3, 1, "near")]),
            (RequestFinished(3), [Dispatch(4, 1, "near")]),
        ],
    )


def test_after_a_peer_failure_a_target_a_reload_removed_is_answered_with_the_failure() -> None:
    # checks: INV-PEER-FALLBACK, INV-RELOAD
    only_near = Settings(models=[ModelSpec("near", load_on_startup=True)])
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "near"), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "auto"), [Forward(2, "box", "far")]),
            (RequestArrived(3, "far"), [Forward(3, "box", "far")]),
            # The reload removes far, both pools and the peers; 2 and 3 are still at box.
            (SettingsChanged(only_near), []),
            # Their targets are gone: neither waits again (not even 2 for near, a member of its old pool).
            (
                PeerFailed(2, "connection reset", down=True),
                [Reject(2, RejectCode.PEER_UNREACHABLE, _failed("far", "connection reset"))],
            ),
            (
                PeerFailed(3, "answered 500: boom", status=500),
                [Reject(3, RejectCode.PEER_FAILED, _failed("far", "answered 500: boom"), peer_status=500)],
            ),
            (RequestFinished(1), []),
        ],
    )


def test_after_a_peer_failure_a_pool_a_reload_shrank_falls_back_to_what_is_left() -> None:
    # checks: INV-PEER-FALLBACK
    shrunk = Settings(
        models=[ModelSpec("near", load_on_startup=True)], pools=[PoolSpec("auto", ("near",), fallback=True)]
    )
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "auto"), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "auto"), [Forward(2, "box", "far")]),
            (SettingsChanged(shrunk), []),
            (PeerFailed(2, "connection reset", down=True), []),
            (RequestFinished(1), [Dispatch(2, 1, "near")]),
        ],
    )


def test_a_pool_whose_peer_members_have_not_joined_yet_is_answered_503() -> None:
    # checks: INV-ANSWER
    later = "no member of 'later' is served now (a peer's model joins once its peer answers)"
    play(
        Settings(models=[ModelSpec("near")], pools=[PoolSpec("later", (), fallback=True)]),
        [(RequestArrived(1, "later"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, later)])],
    )


def test_a_peer_failure_while_shutting_down_is_answered_shutting_down() -> None:
    # checks: INV-SHUTDOWN, INV-ANSWER
    play(
        _settings(),
        [
            (RequestArrived(1, "auto"), [Forward(1, "box", "far")]),  # near is not loaded yet
            (ShutdownRequested(30.0), [WakeAt(30.0)]),
            (
                PeerFailed(1, "connection refused", down=True, status=503),
                [
                    Reject(1, RejectCode.SHUTTING_DOWN, "the router is shutting down; retry shortly"),
                    Stopped(),
                ],
            ),
        ],
    )


def test_a_peer_failure_for_a_request_no_peer_holds_is_illegal_and_changes_nothing() -> None:
    # checks: INV-ILLEGAL
    state, _ = run(
        initial_state(_settings()),
        [
            Startup(),
            ReplicaReady(1),
            RequestArrived(1, "near"),
            RequestArrived(2, "near"),
            RequestArrived(3, "far"),
        ],
    )
    assert state.requests[1].replica == 1 and state.requests[2].phase == "queued" and state.requests[3].peer
    for rid in (1, 2, 4):  # dispatched to a replica here, waiting, unknown
        with pytest.raises(IllegalEvent):
            step(state, PeerFailed(rid, "connection refused", down=True))
    _, commands = step(state, PeerFailed(3, "connection refused", down=True))
    assert commands == (Reject(3, RejectCode.PEER_UNREACHABLE, _failed("far", "connection refused")),)


def test_a_pool_whose_peer_member_is_at_its_limit_loads_its_local_member() -> None:
    # checks: INV-POOL-PRIORITY
    play(
        Settings(
            models=[ModelSpec("near"), ModelSpec("far", gpus=(), peer="box")],
            pools=[PoolSpec("back", ("far", "near"), fallback=True)],
            peers=[PeerSpec("box", max_in_flight=1)],
        ),
        [
            (RequestArrived(1, "far"), [Forward(1, "box", "far")]),
            # far comes first but its peer is full, and no replica of a peer model ever runs here.
            (RequestArrived(2, "back"), [Spawn(1, "near", (0,), "request 2 for 'back'", 2)]),
            (ReplicaReady(1), [Dispatch(2, 1, "near")]),
        ],
    )


def test_a_reload_forgets_a_removed_peer_being_down_and_keeps_the_others_down() -> None:
    # checks: INV-PEER-DOWN, INV-RELOAD
    without_box = Settings(
        models=[ModelSpec("near"), ModelSpec("wide", gpus=(), peer="cloud")],
        peers=[PeerSpec("cloud", max_in_flight=1)],
    )
    down = (
        "peer 'cloud' serving 'wide' is down (no answer); retry once it is back, or ask for a model "
        "served here"
    )
    state = play(
        _settings(),
        [
            (PeerState("box", up=False, reason="connection refused"), []),
            (PeerState("cloud", up=False, reason="no answer"), []),
            (SettingsChanged(without_box), []),
            (RequestArrived(1, "wide"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, down)]),
        ],
    )
    assert state.peers_down == {"cloud": "no answer"}


def test_a_peer_takes_four_requests_at_once_unless_told_otherwise() -> None:
    # checks: INV-PEER-LIMIT
    play(
        Settings(models=[ModelSpec("far", gpus=(), peer="box")], peers=[PeerSpec("box")]),
        [
            *((RequestArrived(rid, "far"), [Forward(rid, "box", "far")]) for rid in (1, 2, 3, 4)),
            (RequestArrived(5, "far"), []),
            (RequestFinished(2), [Forward(5, "box", "far")]),
        ],
    )


def test_a_peer_allowed_no_request_in_flight_gets_none() -> None:
    # checks: INV-PEER-LIMIT
    play(
        Settings(
            models=[ModelSpec("near"), ModelSpec("far", gpus=(), peer="box")],
            pools=[PoolSpec("back", ("far", "near"), fallback=True)],
            peers=[PeerSpec("box", max_in_flight=0)],
        ),
        [
            (RequestArrived(1, "back"), [Spawn(1, "near", (0,), "request 1 for 'back'", 1)]),
            (RequestArrived(2, "far"), []),
        ],
    )
