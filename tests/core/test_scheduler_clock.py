"""``At(t, e)``: a Tick and an event in one step (spec §3, INV-AT)."""

from __future__ import annotations

import pytest
from pyrsistent import pmap

from statemachine import (
    At,
    IllegalEvent,
    ModelSpec,
    PoolSpec,
    RequestArrived,
    RequestFinished,
    Settings,
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
