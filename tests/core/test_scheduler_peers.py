"""Scheduler scenarios: models served by peer routers (Forward, PeerFailed, PeerState, the hop rule).

``far`` is served by peer ``box`` (at most two requests in flight there); ``near`` runs here on GPU 0; pool
``auto`` tries ``near`` first, then ``far``.
"""

from __future__ import annotations

from statemachine import (
    ClientGone,
    Dispatch,
    Forward,
    ModelSpec,
    PeerFailed,
    PeerSpec,
    PeerState,
    Policy,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    ShutdownRequested,
    Spawn,
    Startup,
    Stopped,
    Tick,
    WakeAt,
)
from tests.support.scenario import play


def _settings(limit: int = 2, **policy: object) -> Settings:
    return Settings(
        models=[ModelSpec("near", load_on_startup=True), ModelSpec("far", gpus=(), peer="box")],
        pools=[PoolSpec("auto", ("near", "far"), fallback=True)],
        peers=[PeerSpec("box", max_in_flight=limit)],
        policy=Policy(**policy),  # type: ignore[arg-type]
    )


_READY = [(Startup(), [Spawn(1, "near", (0,), "load on startup")]), (ReplicaReady(1), [])]


def test_requests_for_a_peer_model_are_forwarded_up_to_its_limit_then_wait_in_order() -> None:
    # checks: INV-PEER-LIMIT, INV-PEER-HOME
    play(
        _settings(limit=2),
        [
            (RequestArrived(1, "far"), [Forward(1, "box", "far")]),
            (RequestArrived(2, "far"), [Forward(2, "box", "far")]),
            (RequestArrived(3, "far"), []),
            (RequestArrived(4, "far"), []),
            (RequestFinished(2), [Forward(3, "box", "far")]),
            (ClientGone(1), [Forward(4, "box", "far")]),
        ],
    )


def test_waiting_for_a_peer_counts_against_the_queue_limit() -> None:
    # checks: INV-LIMITS
    play(
        _settings(limit=1, queue_limit=1),
        [
            (RequestArrived(1, "far"), [Forward(1, "box", "far")]),
            (RequestArrived(2, "far"), []),
            (
                RequestArrived(3, "far"),
                [
                    Reject(
                        3,
                        RejectCode.QUEUE_FULL,
                        "the queue is full (1 requests waiting, queue_limit = 1); retry later",
                    )
                ],
            ),
        ],
    )


def test_a_pool_falls_back_to_the_peer_when_the_local_member_is_busy() -> None:
    # checks: INV-POOL-PRIORITY
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "auto"), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "auto"), [Forward(2, "box", "far")]),
            (RequestFinished(1), []),
            (RequestArrived(3, "auto"), [Dispatch(3, 1, "near")]),
        ],
    )


def test_a_peer_that_fails_a_pooled_request_is_a_capacity_miss_and_never_retried_for_it() -> None:
    # checks: INV-PEER-FALLBACK
    play(
        Settings(
            models=[ModelSpec("near", load_on_startup=True), ModelSpec("far", gpus=(), peer="box")],
            pools=[PoolSpec("back", ("far", "near"), fallback=True)],
            peers=[PeerSpec("box", max_in_flight=2)],
        ),
        [
            *_READY,
            (RequestArrived(1, "back"), [Forward(1, "box", "far")]),
            (PeerFailed(1, "503 queue full", status=503), [Dispatch(1, 1, "near")]),
            # The peer is not marked down by a 5xx: the next request goes there first again.
            (RequestArrived(2, "back"), [Forward(2, "box", "far")]),
        ],
    )


def test_a_pooled_request_whose_peer_failed_waits_for_the_busy_local_member() -> None:
    # checks: INV-PEER-FALLBACK
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "auto"), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "auto"), [Forward(2, "box", "far")]),
            (PeerFailed(2, "connection refused", down=True), []),
            (RequestFinished(1), [Dispatch(2, 1, "near")]),
        ],
    )


def test_a_direct_request_gets_the_peer_failure_and_a_down_peer_refuses_at_once() -> None:
    # checks: INV-PEER-DOWN
    down = (
        "peer 'box' serving 'far' is down (connection refused); retry once it is back, or ask for a model "
        "served here"
    )
    play(
        _settings(),
        [
            (RequestArrived(1, "far"), [Forward(1, "box", "far")]),
            (RequestArrived(2, "far"), [Forward(2, "box", "far")]),
            (RequestArrived(3, "far"), []),
            (
                PeerFailed(1, "connection refused", down=True),
                [
                    Reject(
                        1, RejectCode.PEER_UNREACHABLE, "peer 'box' serving 'far' failed: connection refused"
                    ),
                    Reject(3, RejectCode.MODEL_UNAVAILABLE, down),
                ],
            ),
            (RequestArrived(4, "far"), [Reject(4, RejectCode.MODEL_UNAVAILABLE, down)]),
            (RequestFinished(2), []),
            (PeerState("box", up=True), []),
            (RequestArrived(5, "far"), [Forward(5, "box", "far")]),
            (
                PeerFailed(5, "answered 500: boom", status=500),
                [
                    Reject(
                        5,
                        RejectCode.PEER_FAILED,
                        "peer 'box' serving 'far' failed: answered 500: boom",
                        peer_status=500,
                    )
                ],
            ),
        ],
    )


def test_a_down_peer_never_blocks_local_models_and_pools_skip_it() -> None:
    play(
        _settings(),
        [
            *_READY,
            (PeerState("box", up=False, reason="no answer within 5 s"), []),
            (RequestArrived(1, "auto"), [Dispatch(1, 1, "near")]),
            (RequestArrived(2, "auto"), []),  # waits for near: far's peer is down
            (RequestArrived(3, "near"), []),
            (RequestFinished(1), [Dispatch(2, 1, "near")]),
            (PeerState("box", up=True), []),
            (RequestArrived(4, "auto"), [Forward(4, "box", "far")]),
        ],
    )


def test_a_request_from_another_router_is_never_forwarded_again() -> None:
    # checks: INV-HOP
    loop = (
        "'far' is served by another router here, and this request was forwarded by a router already; it is "
        "not forwarded a second time, so that two routers that peer with each other cannot pass it back and "
        "forth. Send it to the router that serves the model itself"
    )
    play(
        _settings(),
        [
            *_READY,
            (RequestArrived(1, "far", local_only=True), [Reject(1, RejectCode.LOOP_DETECTED, loop)]),
            (RequestArrived(2, "auto", local_only=True), [Dispatch(2, 1, "near")]),
            (RequestArrived(3, "auto", local_only=True), []),  # waits for near, never goes to the peer
            (RequestFinished(2), [Dispatch(3, 1, "near")]),
        ],
    )


def test_shutdown_waits_for_forwarded_requests_until_the_deadline() -> None:
    # checks: INV-SHUTDOWN
    play(
        Settings(models=[ModelSpec("far", gpus=(), peer="box")], peers=[PeerSpec("box")]),
        [
            (RequestArrived(1, "far"), [Forward(1, "box", "far")]),
            (RequestArrived(2, "far"), [Forward(2, "box", "far")]),
            (ShutdownRequested(10.0), [WakeAt(10.0)]),
            (RequestFinished(1), []),
            (
                Tick(10.0),
                [Reject(2, RejectCode.SHUTTING_DOWN, "router shutdown deadline reached"), Stopped()],
            ),
        ],
    )
