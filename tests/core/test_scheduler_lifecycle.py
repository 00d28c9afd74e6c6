"""Scheduler scenarios: unload, ttl, reload, shutdown and illegal events.

Each scenario is a list of (event, the commands ``step()`` must answer with); every intermediate state is also
checked with ``statemachine.check``. Model ``a`` and ``b`` share GPU 0 unless said otherwise.
"""

from __future__ import annotations

import pytest

from statemachine import (
    ClientGone,
    Dispatch,
    IllegalEvent,
    Kill,
    KillCause,
    LoadFailed,
    ModelSpec,
    Policy,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Startup,
    Stopped,
    Tick,
    UnloadRequested,
    WakeAt,
    step,
)
from tests.support.scenario import play, shutting_down, spawn


# ------------------------------------------------------------------------------------------ unload and ttl
def test_unload_drains_busy_replicas_and_force_kills_them() -> None:
    # checks: INV-UNLOAD INV-KILL-IDLE INV-CAUSE
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    exited = "the replica of 'b' serving this request exited: killed"
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestArrived(3, "a"), []),
            (UnloadRequested(None), [spawn(3, "a", 3)]),  # the waiting request needs a fresh replica
            (RequestFinished(1), [Kill(1, "a", "unloaded", KillCause.DRAINED)]),
            (
                UnloadRequested("b", force=True),
                [Kill(2, "b", "unload requested (forced)", KillCause.UNLOADED)],
            ),
            (ReplicaExited(1, "killed"), []),
            (ReplicaExited(2, "killed"), [Reject(2, RejectCode.REPLICA_EXITED, exited)]),
        ],
    )


def test_ttl_unloads_an_idle_model() -> None:
    play(
        Settings(models=[ModelSpec("a", ttl=5.0)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (Tick(1.0), []),
            (RequestFinished(1), [WakeAt(6.0)]),
            (Tick(3.0), []),
            (Tick(6.0), [Kill(1, "a", "idle for 5 s (ttl)", KillCause.IDLE_TTL)]),
        ],
    )


# -------------------------------------------------------------------------------------------------- reload
def test_reload_restarts_changed_models_and_keeps_the_others() -> None:
    """b gets two slots: its busy replica drains while a new one starts; a keeps serving; c is new."""
    # checks: INV-RELOAD INV-RETIRED
    old = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    new = Settings(
        models=[ModelSpec("a"), ModelSpec("b", gpus=(1,), slots=2), ModelSpec("c", gpus=(1,))],
        policy=Policy(max_models_per_gpu=2),
    )
    state = play(
        old,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestArrived(3, "b"), []),
            (SettingsChanged(new, frozenset({"b"})), [spawn(3, "b", 3, gpus=(1,))]),
            (RequestArrived(4, "c"), [spawn(4, "c", 4, gpus=(1,))]),
            (RequestFinished(2), [Kill(2, "b", "unloaded", KillCause.DRAINED)]),
            (ReplicaExited(2, "killed"), []),
            (ReplicaReady(3), [Dispatch(3, 3, "b")]),
            (RequestArrived(5, "b"), [Dispatch(5, 3, "b")]),  # the new replica has two slots
            (RequestArrived(6, "a"), []),  # a kept its replica and its request
        ],
    )
    assert [(r.id, r.model) for r in state.replicas] == [(1, "a"), (3, "b"), (4, "c")]
    assert not state.retired


def test_reload_removing_a_model_answers_its_waiters_and_drains_it() -> None:
    # checks: INV-RELOAD
    old = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    new = Settings(models=[ModelSpec("a")])
    removed = "'b' was removed from the configuration while this request waited"
    state = play(
        old,
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1, gpus=(1,))]),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
            (ReplicaReady(1), [Dispatch(1, 1, "b")]),
            (RequestArrived(3, "b"), []),
            (
                SettingsChanged(new, frozenset({"b"})),
                [Reject(3, RejectCode.MODEL_NOT_FOUND, removed)],
            ),
            (
                RequestArrived(4, "b"),
                [Reject(4, RejectCode.MODEL_NOT_FOUND, "model 'b' is not served here; known models: a")],
            ),
            (RequestFinished(1), [Kill(1, "b", "unloaded", KillCause.DRAINED)]),
            (ReplicaExited(1, "killed"), []),
            (
                SettingsChanged(Settings(models=[ModelSpec("z")]), frozenset()),
                [
                    Kill(
                        2, "a", "removed from the configuration", KillCause.RELOAD
                    ),  # idle (still loading): killed at once
                    Reject(2, RejectCode.MODEL_NOT_FOUND, removed.replace("'b'", "'a'")),
                ],
            ),
        ],
    )
    assert [r.model for r in state.replicas] == ["a"] and list(state.retired) == [2]


# ------------------------------------------------------------------------------------------------ shutdown
def test_shutdown_rejects_waiters_lets_work_finish_until_the_deadline() -> None:
    # checks: INV-SHUTDOWN LIVE-DEADLINE INV-CAUSE
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    exited = "the replica of 'a' serving this request exited: killed"
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (RequestArrived(3, "a"), []),
            (
                ShutdownRequested(10.0),
                [shutting_down(3), Kill(2, "b", "router shutting down", KillCause.SHUTDOWN), WakeAt(10.0)],
            ),
            (RequestArrived(4, "a"), [shutting_down(4)]),
            (Startup(), []),
            (Tick(5.0), []),
            (Tick(10.0), [Kill(1, "a", "router shutdown deadline reached", KillCause.DEADLINE)]),
            (ReplicaExited(2, "killed"), []),
            (ReplicaExited(1, "killed"), [Reject(1, RejectCode.REPLICA_EXITED, exited), Stopped()]),
        ],
    )


def test_graceful_shutdown_stops_when_the_last_request_finishes() -> None:
    # checks: LIVE-STOP
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ShutdownRequested(30.0), [WakeAt(30.0)]),
            (RequestFinished(1), [Kill(1, "a", "router shutting down", KillCause.SHUTDOWN)]),
            (ReplicaExited(1, "killed"), [Stopped()]),
        ],
    )


def test_a_second_earlier_shutdown_deadline_wins() -> None:
    """Shutdown at 30, then at 10: the busy replica is killed at 10; a later third one changes nothing."""
    # checks: INV-SHUTDOWN INV-WAKE-EARLIEST
    exited = "the replica of 'a' serving this request exited: killed"
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ShutdownRequested(30.0), [WakeAt(30.0)]),
            (ShutdownRequested(10.0), [WakeAt(10.0)]),
            (ShutdownRequested(20.0), []),
            (Tick(10.0), [Kill(1, "a", "router shutdown deadline reached", KillCause.DEADLINE)]),
            (ReplicaExited(1, "killed"), [Reject(1, RejectCode.REPLICA_EXITED, exited), Stopped()]),
        ],
    )


# ------------------------------------------------------------------------------------------ illegal events
def test_illegal_events_raise_and_leave_the_state_unchanged() -> None:
    # checks: INV-ILLEGAL
    state = play(
        Settings(models=[ModelSpec("a")]),
        [
            (Tick(1.0), []),
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "a"), []),
            (RequestArrived(3, "a"), []),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ClientGone(1), [Dispatch(2, 1, "a")]),
        ],
    )
    illegal: list[object] = [
        Tick(0.5),  # back in time
        RequestArrived(3, "a"),  # already waiting
        RequestFinished(3),  # not in flight
        RequestFinished(9),  # unknown
        ClientGone(1),  # already gone
        ClientGone(9),
        ReplicaReady(1),  # already ready
        LoadFailed(1, "x"),
        ReplicaReady(9),
        ReplicaExited(9, "x"),
        UnloadRequested("zzz"),
        "not an event",
    ]
    before = repr(state)
    for event in illegal:
        with pytest.raises(IllegalEvent):
            step(state, event)  # type: ignore[arg-type]
        assert repr(state) == before
    # the state still works: the running request finishes and the next one takes the slot
    state, commands = step(state, RequestFinished(2))
    assert list(commands) == [Dispatch(3, 1, "a")]
