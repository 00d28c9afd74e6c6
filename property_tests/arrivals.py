"""An arrival's step against the same arrival passed through its queue (INV-ARRIVE-AT-ONCE).

``step()`` sends a request that arrives while nothing waits straight to a free slot; wrapped around a
machine's ``feed``, ``checking_arrivals`` checks before every arrival that this ends exactly as queueing the
request and letting the pass dispatch it would: the same state and the same commands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from statemachine import Command, Event, IllegalEvent, RequestArrived, State, run
from statemachine.passes import schedule
from statemachine.scheduler import _admit as admit
from statemachine.work import Work

M = TypeVar("M", bound=Any)
R = TypeVar("R")


def checking_arrivals(feed: Callable[[M, Event], R]) -> Callable[[M, Event], R]:
    """``feed``, which first checks that an arrival's step ends as it would had the request passed through
    its queue (the step dispatches an arrival at once when nothing waits and a slot is free)."""

    def checked(self: M, event: Event) -> R:
        # checks: INV-ARRIVE-AT-ONCE
        state = self.state
        if state is not None and isinstance(event, RequestArrived):
            queued = _through_queue(state, event)
            try:
                direct: tuple[State, list[Command]] | str = run(state, [event])
            except IllegalEvent:
                direct = "illegal"
            replay = self.replay() if hasattr(self, "replay") else ""
            assert direct == queued, (
                f"INV-ARRIVE-AT-ONCE: {event!r} ends otherwise than through its queue{replay}"
            )
        return feed(self, event)

    return checked


def _through_queue(state: State, event: RequestArrived) -> tuple[State, list[Command]] | str:
    """The arrival's step with the request always queued first, and the pass dispatching it."""
    w = Work(state)
    try:
        admitted = admit(w, event)
    except IllegalEvent:
        return "illegal"
    if admitted is not None:
        w.enqueue(admitted[0])
    schedule(w)
    return w.freeze(), list(w.cmds)
