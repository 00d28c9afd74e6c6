"""Scheduler scenarios: loads asked for (LoadRequested), loads abandoned by their last waiter, and a request's
keep-alive (spec §4c).

Models ``a`` and ``b`` share GPU 0 (one model at a time) unless said otherwise.
"""

from __future__ import annotations

import math

import pytest

from statemachine import (
    ClientGone,
    Dispatch,
    IllegalEvent,
    Kill,
    KillCause,
    LoadRequested,
    ModelSpec,
    PeerSpec,
    Policy,
    PoolSpec,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
    Tick,
    UnloadRequested,
    WakeAt,
    initial_state,
    step,
)
from tests.support.scenario import evict, play, spawn


def two(**policy: object) -> Settings:
    return Settings(models=[ModelSpec("a"), ModelSpec("b")], policy=Policy(**policy))  # type: ignore[arg-type]


def asked(replica: int, model: str, gpus: tuple[int, ...] = (0,)) -> Spawn:
    return Spawn(replica, model, gpus, "load requested", None)


def abandoned(replica: int, model: str) -> Kill:
    return Kill(replica, model, "abandoned: every request waiting for it left", KillCause.ABANDONED)


def idle(replica: int, model: str, seconds: float, why: str = "keep_alive") -> Kill:
    return Kill(replica, model, f"idle for {seconds:g} s ({why})", KillCause.IDLE_TTL)


# ---------------------------------------------------------------------------------------- loads asked for


def test_a_load_asked_for_an_unknown_model_is_an_illegal_event() -> None:
    """The shell checks the name first (404); a LoadRequested for a model the settings lack is its fault."""
    with pytest.raises(IllegalEvent, match="unknown model 'nope'"):
        step(initial_state(two()), LoadRequested("nope"))


def test_a_load_asked_for_starts_at_once_when_it_fits() -> None:
    """b is asked for on a free GPU: its replica starts, names no request, and serves the next request.
    checks: INV-LOAD-ASKED"""
    state = play(
        two(),
        [
            (LoadRequested("b"), [asked(1, "b")]),
            (LoadRequested("b"), []),  # loading already: nothing more
            (ReplicaReady(1), []),
            (RequestArrived(1, "b"), [Dispatch(1, 1, "b")]),
        ],
    )
    assert state.wanted == ()


def test_a_load_asked_for_starts_the_replicas_a_model_still_lacks() -> None:
    """a has two replicas; one of them exits (a crash): asked for, a gets its second one again.
    checks: INV-LOAD-ASKED"""
    state = play(
        Settings(models=[ModelSpec("a", replicas=2)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), []),
            (RequestFinished(1), []),
            (ReplicaExited(2, "crashed"), []),
            (LoadRequested("a"), [asked(3, "a")]),
            (LoadRequested("a"), []),  # both are there: nothing more
        ],
    )
    assert state.wanted == ()


def test_a_load_asked_for_evicts_idle_residents_and_waits_for_busy_ones() -> None:
    """a is busy: b waits (a is never stopped for it); once a is idle it is evicted, and b starts when a has
    exited. checks: INV-LOAD-ASKED"""
    state = play(
        two(),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (LoadRequested("b"), []),
            (RequestFinished(1), [evict(1, "a", "b")]),
            (ReplicaExited(1, "evicted"), [asked(2, "b")]),
        ],
    )
    assert state.wanted == ()


def test_waiting_requests_go_before_a_load_asked_for() -> None:
    """A request for a waits while a is busy: b, asked for, takes nothing from it (a is protected).
    checks: INV-LOAD-ASKED"""
    state = play(
        Settings(models=[ModelSpec("a"), ModelSpec("b")], policy=Policy(queue_head_grace=0.0)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), []),
            (LoadRequested("b"), []),
            (RequestFinished(1), [Dispatch(2, 1, "a")]),
            (RequestFinished(2), [evict(1, "a", "b")]),
        ],
    )
    assert state.wanted == ("b",)


def test_an_unload_forgets_a_load_asked_for() -> None:
    """checks: INV-LOAD-ASKED"""
    state = play(
        two(),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (LoadRequested("b"), []),
            (UnloadRequested("b"), []),
            (RequestFinished(1), []),
        ],
    )
    assert state.wanted == ()


def test_loads_asked_for_start_in_the_order_asked() -> None:
    """Two GPUs, three models asked for: the first two start, the third (on GPU 0 like the first) evicts the
    first once its load is done (a load is never cut short for another). checks: INV-LOAD-ASKED"""
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,)), ModelSpec("c")])
    play(
        settings,
        [
            (LoadRequested("a"), [asked(1, "a")]),
            (LoadRequested("b"), [asked(2, "b", (1,))]),
            (LoadRequested("c"), []),
            (ReplicaReady(1), [evict(1, "a", "c")]),
            (ReplicaExited(1, "evicted"), [asked(3, "c")]),
        ],
    )


def test_a_model_that_can_never_load_is_not_kept_wanted() -> None:
    """a is pinned on GPU 0, which holds one model: b, asked for there, can never load.
    checks: INV-LOAD-ASKED"""
    settings = Settings(models=[ModelSpec("a", pinned=True), ModelSpec("b")])
    state = play(
        settings,
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup", None)]),
            (LoadRequested("b"), []),
        ],
    )
    assert state.wanted == ()


def test_a_load_asked_for_a_refused_or_peer_model_starts_nothing_here() -> None:
    """A model placement refused, or one a peer serves, has nothing to load here: asking for it starts no
    replica and keeps nothing wanted.
    checks: INV-LOAD-ASKED"""
    settings = Settings(
        models=[ModelSpec("big", refusal="too big"), ModelSpec("far", gpus=(), peer="attic")],
        peers=[PeerSpec("attic")],
    )
    state = play(settings, [(LoadRequested("big"), []), (LoadRequested("far"), [])])
    assert state.wanted == () and not state.replicas


# ------------------------------------------------------------------------------------------- abandoned
def test_a_load_whose_last_waiter_left_stops_at_once() -> None:
    """b loads for request 1, which leaves: the load stops in that step, and a waiting request for a gets the
    GPU once it has exited. checks: INV-ABANDON"""
    play(
        two(),
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1)]),
            (RequestArrived(2, "a"), []),
            (ClientGone(1), [abandoned(1, "b")]),
            (ReplicaExited(1, "abandoned"), [spawn(2, "a", 2)]),
        ],
    )


def test_a_load_someone_else_waits_for_or_asked_for_goes_on() -> None:
    """Request 2 also waits for b (through a pool): its load goes on when request 1 leaves. A load asked
    for goes on when the request that waited for it leaves. checks: INV-ABANDON"""
    settings = Settings(
        models=[ModelSpec("a", gpus=(1,)), ModelSpec("b")], pools=[PoolSpec("p", ("b", "a"), fallback=True)]
    )
    play(
        settings,
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1)]),
            (RequestArrived(2, "p"), [spawn(2, "a", 2, "p", gpus=(1,))]),
            (ClientGone(1), []),  # request 2 may still be served by b
            (ClientGone(2), [abandoned(1, "b"), abandoned(2, "a")]),
        ],
    )
    play(
        two(),
        [
            (LoadRequested("b"), [asked(1, "b")]),
            (RequestArrived(1, "b"), []),
            (ClientGone(1), []),
        ],
    )


def test_a_ready_replica_is_not_abandoned() -> None:
    """The load finished: its waiter leaving changes nothing (its idle time rules). checks: INV-ABANDON"""
    settings = Settings(models=[ModelSpec("a", slots=1)])
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), []),
            (ClientGone(2), []),
        ],
    )


# ------------------------------------------------------------------------------------------ keep-alive
def test_a_requests_keep_alive_replaces_the_ttl_for_the_residency() -> None:
    """a's ttl is 100 s; a request asks for 5 s: a stops 5 s after it, and its next residency has its ttl
    again. checks: INV-KEEP-ALIVE"""
    settings = Settings(models=[ModelSpec("a", ttl=100.0)])
    play(
        settings,
        [
            (RequestArrived(1, "a", keep_alive=5.0), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (Tick(1.0), []),
            (RequestFinished(1), [WakeAt(6.0)]),
            (Tick(6.0), [idle(1, "a", 5.0)]),
            (ReplicaExited(1, "idle"), []),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "a")]),
            (RequestFinished(2), [WakeAt(106.0)]),
        ],
    )


def test_keep_alive_zero_stops_when_idle_and_infinity_never() -> None:
    """checks: INV-KEEP-ALIVE"""
    settings = Settings(models=[ModelSpec("a", ttl=10.0)])
    play(
        settings,
        [
            (RequestArrived(1, "a", keep_alive=0.0), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(1), [idle(1, "a", 0.0)]),
        ],
    )
    play(
        settings,
        [
            (RequestArrived(1, "a", keep_alive=math.inf), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(1), []),
            (Tick(1000.0), []),
        ],
    )


def test_a_late_report_of_a_load_that_was_stopped_changes_nothing() -> None:
    """The load is abandoned while its readiness (or its failure) is on its way: the report is dropped.
    checks: INV-ABANDON"""
    from statemachine import LoadFailed

    play(
        two(),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ClientGone(1), [abandoned(1, "a")]),
            (ReplicaReady(1), []),
            (LoadFailed(1, "no /health"), []),
            (ReplicaExited(1, "stopped"), []),
        ],
    )


def test_a_load_asked_for_keeps_off_the_gpus_a_waiting_request_needs() -> None:
    """b waits for its swap while a is held for its client: c, asked for on the same GPU, takes nothing (it
    would evict the idle a ahead of b). checks: INV-LOAD-ASKED"""
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b"), ModelSpec("c")],
        policy=Policy(queue_head_grace=60.0, swap_batch_max=4, swap_hold=30.0),
    )
    state = play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(1), []),
            (RequestArrived(2, "b"), [WakeAt(30.0)]),  # a is held until 30
            (LoadRequested("c"), []),
        ],
    )
    assert state.wanted == ("c",)


def test_a_failing_model_asked_for_starts_nothing_more() -> None:
    """Two replicas of a load; one fails: a load asked for starts no third while the other settles.
    checks: INV-LOAD-ASKED"""
    from statemachine import LoadFailed

    settings = Settings(models=[ModelSpec("a", replicas=2, gpus=(0,))], policy=Policy(max_models_per_gpu=1))
    state = play(
        settings,
        [
            (LoadRequested("a"), [asked(1, "a"), asked(2, "a")]),
            (
                LoadFailed(1, "no /health"),
                [Kill(1, "a", "load failed: no /health", KillCause.LOAD_FAILED)],
            ),
            (LoadRequested("a"), []),
        ],
    )
    assert state.wanted == ()


def test_a_model_a_reload_removed_is_no_longer_wanted() -> None:
    """checks: INV-LOAD-ASKED"""
    from statemachine import SettingsChanged

    state = play(
        two(),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (LoadRequested("b"), []),
            (SettingsChanged(Settings(models=[ModelSpec("a")])), []),
        ],
    )
    assert state.wanted == ()
