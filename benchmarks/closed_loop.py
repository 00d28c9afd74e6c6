"""Closed-loop agents on the scheduler itself with a simulated clock (no I/O, exact figures): the event loop
the swap and placement benchmarks share.

A load takes ``load`` seconds, a stop ``STOP`` seconds; every WakeAt becomes a Tick. A benchmark says when
each agent sends (``send``, calling ``arrive``), how long a dispatched request runs (``service``) and what an
agent does once its reply is complete (``finished``); the loop records loads, waits and the time of the last
answer.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from statemachine import (
    Dispatch,
    Event,
    Kill,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    Tick,
    WakeAt,
    initial_state,
    step,
)

STOP = 0.5


class ClosedLoop:
    def __init__(self, settings: Settings, load: float) -> None:
        self.state = initial_state(settings)
        self.load = load
        self.now = 0.0
        self.total = 0.0  # when the last reply was complete
        self.pending: list[tuple[float, int, object]] = []
        self.order = itertools.count()
        self.rids = itertools.count(1)
        self.owner: dict[int, int] = {}  # request -> the agent that sent it
        self.sent: dict[int, float] = {}
        self.waits: list[float] = []  # arrival to dispatch, per request
        self.spawns: list[Spawn] = []
        self.first: dict[str, tuple[int, ...]] = {}  # model -> the GPUs of its first load
        self.killed: set[int] = set()

    # ------------------------------------------------------------------ what a benchmark defines
    def send(self, agent: int) -> None:
        """Agent ``agent``'s turn to send (``arrive``), or not."""
        raise NotImplementedError

    def service(self, rid: int) -> float:
        """Seconds request ``rid`` runs once dispatched."""
        raise NotImplementedError

    def finished(self, agent: int) -> None:
        """The reply to ``agent``'s request is complete (``later(..., ("send", agent))`` for its next)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------- the loop
    def later(self, at: float, what: object) -> None:
        heapq.heappush(self.pending, (at, next(self.order), what))

    def arrive(self, agent: int, model: str) -> None:
        rid = next(self.rids)
        self.owner[rid], self.sent[rid] = agent, self.now
        self.feed(RequestArrived(rid, model))

    def feed(self, event: Event) -> None:
        self.state, commands = step(self.state, event)
        for command in commands:
            match command:
                case Spawn(replica=replica):
                    self.spawns.append(command)
                    self.first.setdefault(command.model, command.gpus)
                    self.later(self.now + self.load, ReplicaReady(replica))
                case Kill(replica=replica):
                    self.killed.add(replica)
                    self.later(self.now + STOP, ReplicaExited(replica, "stopped"))
                case Dispatch(rid=rid):
                    self.waits.append(self.now - self.sent[rid])
                    self.later(self.now + self.service(rid), RequestFinished(rid))
                case WakeAt(at=at):
                    self.later(at, Tick(at))

    @property
    def swaps(self) -> int:
        """Loads beyond the first of each model (a model's first load is paid whatever happens)."""
        return len(self.spawns) - len(self.first)

    def run(self, enough: Callable[[], bool] = lambda: False) -> None:
        """Until nothing is pending, or ``enough()``."""
        while self.pending and not enough():
            at, _, what = heapq.heappop(self.pending)
            if at > self.now:
                self.now = at
                self.feed(Tick(self.now))
            if isinstance(what, tuple):
                self.send(what[1])
            elif isinstance(what, Tick) or (isinstance(what, ReplicaReady) and what.replica in self.killed):
                continue  # a stopped replica reports no readiness
            else:
                self.feed(what)  # type: ignore[arg-type]
                if isinstance(what, RequestFinished):
                    self.total = self.now
                    self.finished(self.owner[what.rid])
