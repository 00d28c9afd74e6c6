"""``At(t, e)``: a Tick and an event in one step (spec §3, INV-AT)."""

from __future__ import annotations

import pytest
from pyrsistent import pmap

from statemachine import (
    At,
    Command,
    IllegalEvent,
    Kill,
    KillCause,
    ModelSpec,
    PoolSpec,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    State,
    Tick,
    initial_state,
    run,
    step,
)

pytestmark = pytest.mark.core


def test_at_is_a_tick_and_the_event_in_one_step() -> None:
    # checks: INV-AT
    # A pool request waits for its first member's load; the pass of a later Tick loads the next member
    # too (fallback by capacity), so the Tick's own pass is part of what At does.
    models = {name: ModelSpec(name=name, gpus=(), pinned=True) for name in ("m0", "m1", "m2")}
    settings = Settings(
        models=pmap(models), pools=pmap({"p": PoolSpec(name="p", members=("m0", "m1"), fallback=True)})
    )
    state, _ = step(initial_state(settings), RequestArrived(1, "p"))
    expected = run(state, [Tick(2.0), RequestArrived(2, "m2")])
    got_state, got_commands = step(state, At(2.0, RequestArrived(2, "m2")))
    assert (got_state, list(got_commands)) == expected
    assert [c.model for c in got_commands] == ["m1", "m2"]  # the Tick's spawn, then the arrival's
    assert got_state.now == 2.0

    for bad in (
        At(3.0, Tick(4.0)),
        At(3.0, At(4.0, RequestArrived(3, "m2"))),
        At(1.0, RequestArrived(3, "m2")),
    ):
        with pytest.raises(IllegalEvent):
            step(got_state, bad)  # around a Tick, inside an At, or back in time
    with pytest.raises(IllegalEvent):
        step(got_state, At(5.0, RequestFinished(1)))  # illegal event: the whole step is, the clock stays


def test_at_leaves_out_a_tick_pass_that_changes_nothing_and_keeps_one_that_does() -> None:
    # checks: INV-AT
    # One idle model with a ttl of 10 s: the last pass asked to wake at its end. An arrival before it needs
    # no pass of the Tick's own (nothing waits); one after it finds the model stopped by that pass first.
    settings = Settings(models=pmap({"m": ModelSpec(name="m", gpus=(0,), ttl=10.0)}))
    state, _ = run(initial_state(settings), [RequestArrived(1, "m"), ReplicaReady(1), RequestFinished(1)])
    assert state.wake_at == 10.0 and not state.waiting
    for t in (4.0, 10.0, 12.0):
        event = RequestArrived(2, "m")
        assert step(state, At(t, event)) == _as_step(state, t, event)
    stopped = [c for c in step(state, At(12.0, RequestArrived(2, "m")))[1] if isinstance(c, Kill)]
    assert [c.cause for c in stopped] == [KillCause.IDLE_TTL]
    assert not [c for c in step(state, At(4.0, RequestArrived(2, "m")))[1] if isinstance(c, Kill)]


def _as_step(state: State, t: float, event: RequestArrived) -> tuple[State, tuple[Command, ...]]:
    """A Tick to ``t`` and ``event``, as one step's outcome."""
    after, commands = run(state, [Tick(t), event])
    return after, tuple(commands)
