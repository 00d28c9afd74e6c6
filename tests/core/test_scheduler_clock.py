"""``At(t, e)``: a Tick and an event in one step (spec §3, INV-AT); an arrival that goes at once
(INV-ARRIVE-AT-ONCE)."""

from __future__ import annotations

import pytest
from pyrsistent import pmap

from statemachine import (
    At,
    Command,
    Dispatch,
    IllegalEvent,
    Kill,
    KillCause,
    ModelSpec,
    PoolSpec,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Startup,
    State,
    Tick,
    initial_state,
    run,
    step,
)
from statemachine.state import INFLIGHT

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


def test_an_arrival_while_nothing_waits_goes_at_once() -> None:
    # checks: INV-ARRIVE-AT-ONCE
    # Key "a" was served three times while "b" sent nothing; then "b"'s request arrives with nothing waiting
    # and a slot free: it goes in this step, and its key re-enters fair share at the clock, as it would had
    # the request been queued first (its tag does not stay behind, claiming the service it did not use).
    settings = Settings(
        models=pmap({"m": ModelSpec(name="m", gpus=(), slots=2, pinned=True)}), weights={"b": 2}
    )
    state, _ = run(initial_state(settings), [Startup(), ReplicaReady(1)])
    for rid in (1, 2, 3):
        state, _ = run(state, [RequestArrived(rid, "m", key="a"), RequestFinished(rid)])
    assert state.fair["a"] == 3.0 and state.vclock == 2.0 and not state.waiting
    after, commands = step(state, RequestArrived(4, "m", key="b"))
    assert commands == (Dispatch(4, 1, "m"),)
    assert after.fair["b"] == 2.5 and after.vclock == 2.0  # starts at the clock, moves on by 1 / weight
    assert after.queues == state.queues and after.queued_by_key == state.queued_by_key
    assert after.requests[4].phase == INFLIGHT
    # While another request waits (for a model that cannot load beside the first, and claims their GPU), an
    # arrival goes through its queue even with a slot free, and the pass keeps it behind the claim.
    two = {"m": ModelSpec(name="m", gpus=(0,), slots=2), "n": ModelSpec(name="n", gpus=(0,))}
    state, _ = run(
        initial_state(Settings(models=pmap(two))),
        [RequestArrived(1, "m"), ReplicaReady(1), RequestArrived(2, "m"), RequestArrived(3, "n")],
    )
    assert state.waiting == 1
    after, commands = step(state, RequestArrived(4, "m"))
    assert commands == () and after.waiting == 2 and after.queues is not state.queues
