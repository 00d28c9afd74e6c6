"""DispatchFailed: a request whose replica refused the connection waits again, in its place."""

from __future__ import annotations

import pytest

from statemachine import (
    Dispatch,
    DispatchFailed,
    IllegalEvent,
    Kill,
    KillCause,
    ModelSpec,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    Settings,
    Spawn,
    check,
    initial_state,
    run,
    step,
)
from statemachine.queries import queued

# checks: INV-QUEUE, INV-REQUEST-HOME


def _settings() -> Settings:
    return Settings(models=[ModelSpec("a", slots=1)])


def test_the_request_waits_again_ahead_of_later_ones_and_the_replica_takes_no_more_work() -> None:
    state, _ = run(
        initial_state(_settings()),
        [RequestArrived(1, "a"), ReplicaReady(1), RequestArrived(2, "a")],
    )
    state, commands = step(state, DispatchFailed(1, "connection refused"))
    check(state)
    # The refusing replica takes no more work and, idle now, is stopped; a fresh one loads at once.
    assert commands == (
        Spawn(2, "a", (0,), "request 1 for 'a'", 1),
        Kill(1, "a", "unloaded", KillCause.DRAINED),
    )
    assert [r.rid for r in queued(state)] == [1, 2]
    state, commands = step(state, ReplicaReady(2))
    check(state)
    assert commands == (Dispatch(1, 2, "a"),)
    state, commands = step(state, ReplicaExited(1, "killed"))
    check(state)
    assert commands == ()


def test_dispatch_failed_for_a_request_not_in_flight_is_illegal() -> None:
    state, _ = run(initial_state(_settings()), [RequestArrived(1, "a")])
    with pytest.raises(IllegalEvent):
        step(state, DispatchFailed(1, "connection refused"))
