"""A replica task's phase table (router.shell.replica_task.MOVES), driven directly: every move it allows,
every one it refuses, and what the task reads off the phases it went through."""

from __future__ import annotations

import itertools
import logging
import signal
from collections import deque
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from router.shell.processes import KvLaunch, LaunchSpec, SupervisorEvent
from router.shell.replica_task import (
    MOVES,
    Happened,
    ProcessPhase,
    ReplicaTask,
    ReplicaTaskFault,
    next_phase,
)
from statemachine.events import ReplicaExited

P, H = ProcessPhase, Happened


def task(*, kv: bool = False, reports: list[SupervisorEvent] | None = None) -> ReplicaTask:
    store: Any = None  # never touched: these tests start no process
    spec = LaunchSpec(7, "m", ("llama-server",), kv=KvLaunch(store, Path("shelf"), None, 1.0) if kv else None)
    sink = reports if reports is not None else []
    return ReplicaTask(spec=spec, log=deque(), report=sink.append, logger=logging.getLogger("test"))


def at(phase: ProcessPhase, **kw: Any) -> ReplicaTask:
    t = task(**kw)
    t.phase = phase
    t.path = [P.PENDING, phase] if phase is not P.PENDING else [P.PENDING]
    return t


@pytest.mark.parametrize(("phase", "happened"), sorted(MOVES, key=lambda m: (m[0].value, m[1].value)))
def test_every_allowed_move(phase: ProcessPhase, happened: Happened) -> None:
    t = at(phase)
    t._move(happened)
    assert t.phase is MOVES[phase, happened] is next_phase(phase, happened)
    assert t.path[-1] is t.phase


ILLEGAL = [(p, h) for p, h in itertools.product(ProcessPhase, Happened) if (p, h) not in MOVES]


def test_every_other_move_is_refused() -> None:
    assert len(ILLEGAL) + len(MOVES) == len(ProcessPhase) * len(Happened)
    for phase, happened in ILLEGAL:
        with pytest.raises(ReplicaTaskFault, match=f"'{happened.value}' cannot happen .* {phase.value}"):
            next_phase(phase, happened)


def test_a_refused_move_leaves_the_phase_as_it_was() -> None:
    t = at(P.LOADING)
    with pytest.raises(ReplicaTaskFault, match="'saved' cannot happen to a replica task that is loading"):
        t._move(H.SAVED)
    assert t.phase is P.LOADING and t.path == [P.PENDING, P.LOADING]


def test_every_phase_is_reached_and_every_one_leads_to_retired() -> None:
    reached, frontier = {P.PENDING}, [P.PENDING]
    while frontier:
        phase = frontier.pop()
        for (start, _), end in MOVES.items():
            if start is phase and end not in reached:
                reached.add(end)
                frontier.append(end)
    assert reached == set(ProcessPhase)
    ends = {P.RETIRED}
    while True:
        more = {start for (start, _), end in MOVES.items() if end in ends} - ends
        if not more:
            break
        ends |= more
    assert ends == set(ProcessPhase)
    assert not [move for move in MOVES if move[0] is P.RETIRED]  # retired is the end


@pytest.mark.parametrize("phase", [P.PENDING, P.LOADING, P.READY])
def test_a_stop_is_taken_before_any_other_and_the_first_reason_stays(phase: ProcessPhase) -> None:
    t = at(phase)
    t.stop("first")
    t.stop("second", save=True)
    assert t.phase is P.STOPPING and t.stop_reason == "first" and t.stop_requested.is_set()


@pytest.mark.parametrize("phase", [P.SAVING, P.STOPPING, P.KILLING, P.EXITED, P.RETIRED])
def test_a_stop_later_is_ignored(phase: ProcessPhase) -> None:
    t = at(phase)
    t.stop("too late")
    assert t.phase is phase and t.stop_reason is None and not t.stop_requested.is_set()


def test_a_save_applies_to_a_ready_replica_started_with_kv() -> None:
    for phase, kv, after in [
        (P.READY, True, P.SAVING),
        (P.READY, False, P.STOPPING),
        (P.LOADING, True, P.STOPPING),
        (P.PENDING, True, P.STOPPING),
    ]:
        t = at(phase, kv=kv)
        t.stop("evicted", save=True)
        assert t.phase is after, (phase, kv)


def test_the_past_is_read_off_the_path() -> None:
    t = task()
    for happened in (H.LAUNCHED, H.HEALTHY, H.ASKED_TO_STOP, H.KILLED, H.EXITED):
        t._move(happened)
    assert t.ever_ready and t.sigkilled
    assert t.snapshot().ready and not t.snapshot().exited
    t.retire()
    assert t.snapshot().exited and t.path == [
        P.PENDING,
        P.LOADING,
        P.READY,
        P.STOPPING,
        P.KILLING,
        P.EXITED,
        P.RETIRED,
    ]
    hung = task()
    for happened in (H.LAUNCHED, H.HEALTHY, H.UNRESPONSIVE, H.EXITED):
        hung._move(happened)
    assert hung.ever_ready and not hung.sigkilled  # the kill of a hung replica is not a stop's SIGKILL


async def test_a_task_stopped_before_it_starts_never_starts() -> None:
    reports: list[SupervisorEvent] = []
    t = task(reports=reports)
    t.stop("changed my mind")
    async with httpx.AsyncHTTPTransport() as http:
        await t.run(http)
    assert reports == [ReplicaExited(7, "stopped: changed my mind")]
    assert t.child is None and t.path == [P.PENDING, P.STOPPING, P.EXITED]


class _Exits:
    """A child whose exit ``run`` sees at the moment a signal reaches it (the signals are recorded)."""

    pid = 4242

    def __init__(self, t: ReplicaTask, on: signal.Signals | None) -> None:
        self.t, self.on, self.signals = t, on, []  # type: list[signal.Signals]

    def signal_group(self, sig: signal.Signals) -> None:
        self.signals.append(sig)
        if sig is self.on:
            self.t._move(H.EXITED)


async def test_an_exit_seen_as_the_save_ends_stops_nothing() -> None:
    # The process dies while its slots are saved; the save's failure and the exit come in the same step,
    # and run() takes the exit first: the stopper must not take 'saved' (or signal a reaped child).
    reports: list[SupervisorEvent] = []
    t = at(P.READY, kv=True, reports=reports)
    t.stop("evicted", save=True)
    child = _Exits(t, None)

    def refuse(request: httpx.Request) -> httpx.Response:
        t._move(H.EXITED)
        raise httpx.ConnectError("connection refused", request=request)

    await t._stop_when_asked(child, httpx.MockTransport(refuse))  # type: ignore[arg-type]
    assert t.phase is P.EXITED and child.signals == []
    assert [type(r).__name__ for r in reports] == ["ReplicaKv"]


async def test_an_exit_seen_as_the_stop_timer_ends_sends_no_sigkill() -> None:
    t = at(P.READY)
    t.spec = attrs.evolve(t.spec, stop_timeout=0.0)
    t.stop("evicted")
    child = _Exits(t, signal.SIGTERM)
    await t._stop_when_asked(child, httpx.MockTransport(lambda r: httpx.Response(500)))  # type: ignore[arg-type]
    assert t.phase is P.EXITED and child.signals == [signal.SIGTERM] and not t.sigkilled
