"""The index of lane heads (statemachine/heads.py) as a cache: it follows the line of states it was built
along, reuses its answers while they hold, keeps its heaps bounded, and never changes an answer.

Its answers themselves are checked against a full ranking after every step of the class machine
(property_tests/test_class_machine.py::ClassMachine.heads_agree)."""

from __future__ import annotations

import attrs

from statemachine import (
    ModelSpec,
    Policy,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    SettingsChanged,
    State,
    Tick,
    initial_state,
    step,
)
from statemachine.heads import HeadIndex, TargetHeads
from statemachine.work import FEW_LANES, Work
from tests.core.test_scheduler_classes import drain, feed, loaded

KEYS = [f"k{i}" for i in range(FEW_LANES + 2)]  # more lanes than are ranked one by one


def busy(**policy: object) -> State:
    """One single-slot model: request 1 runs, three requests of each key wait."""
    settings = Settings(models=[ModelSpec("m", pinned=True)], policy=Policy(**policy))  # type: ignore[arg-type]
    state = loaded(settings)
    arrivals = [RequestArrived(100 * n + i, "m", key=k) for n in range(1, 4) for i, k in enumerate(KEYS)]
    state, went = feed(state, arrivals)
    assert went == [100]
    return state


def heads_of(state: State) -> TargetHeads:
    assert isinstance(state.heads, HeadIndex) and state.heads.owner is state
    return state.heads.targets["m"]


def test_the_index_follows_the_queues_from_state_to_state() -> None:
    state = busy()
    state, _ = drain(state, 100, 7)
    heads = heads_of(state)
    assert heads.queue is state.queues["m"]  # kept up to date, not built again
    state, _ = feed(state, [RequestArrived(999, "m", key="late")])  # a new lane
    assert heads_of(state) is heads and heads.queue is state.queues["m"]
    state, _ = feed(state, [RequestArrived(998, "m", key="late")])  # the same lane, same heads
    assert heads_of(state) is heads and heads.queue is state.queues["m"]


def test_a_best_head_is_remembered_while_it_holds() -> None:
    state = busy()
    w = Work(state)
    first = w.best_head("m")
    assert first is not None and w.best_head("m") is first
    state, _ = feed(state, [Tick(5.0)])  # nothing ages: the next step asks again and gets the same answer
    assert Work(state).best_head("m") is first


def test_aging_moves_the_best_head_when_the_clock_reaches_it() -> None:
    state = busy(max_wait=(1000.0, 50.0, 1000.0))
    state, _ = feed(state, [Tick(10.0), RequestArrived(999, "m", key="k0", klass=RequestClass.INTERACTIVE)])
    assert Work(state).best_head("m")[1].rid == 999  # type: ignore[index]  # its class goes first
    state, _ = feed(state, [Tick(49.0)])
    assert Work(state).best_head("m")[1].rid == 999  # type: ignore[index]
    state, _ = feed(state, [Tick(50.0)])  # the standard requests have waited their maximum: oldest first
    assert Work(state).best_head("m")[1].rid == 101  # type: ignore[index]


def test_a_new_policy_is_ranked_under_at_once() -> None:
    state = busy()
    state, _ = feed(state, [Tick(10.0), RequestArrived(999, "m", key="k0", klass=RequestClass.INTERACTIVE)])
    assert Work(state).best_head("m")[1].rid == 999  # type: ignore[index]
    shorter = attrs.evolve(state.settings, policy=Policy(max_wait=(1000.0, 5.0, 1000.0)))
    state, _ = feed(state, [SettingsChanged(shorter, frozenset())])  # standard requests have waited 10 s
    assert Work(state).best_head("m")[1].rid == 101  # type: ignore[index]


def test_the_heaps_stay_bounded_however_long_the_keys_take_turns() -> None:
    state = busy()
    rid = 10_000
    running = 100
    for turn in range(300):
        key = KEYS[turn % len(KEYS)]
        state, went = feed(state, [RequestArrived(rid, "m", key=key), RequestFinished(running)])
        (running,) = went
        rid += 1
    heads = heads_of(state)
    entries = sum(len(h) for h in heads.by_tag)
    assert entries <= 4 * len(state.queues["m"].lanes) + 64, entries


def test_a_step_from_a_state_off_the_line_builds_its_own_index() -> None:
    state = busy()
    older = state
    state, _ = feed(state, [RequestFinished(100)])
    again, _ = step(older, RequestFinished(100))
    assert again.heads is not state.heads and again == state
    assert initial_state(older.settings).heads is None


def test_heaps_full_of_stale_entries_are_built_again() -> None:
    state = busy()
    w = Work(state)
    heads = w.heads.of("m", state.queues["m"], w.requests, w.fair)
    lanes = len(state.queues["m"].lanes)
    gone = w.requests[200]
    for _ in range(3 * lanes + 64):  # a head that is no head: pushed, never the best, dropped when on top
        heads.moved(state.queues["m"], gone, w.fair)
    assert w.heads.of("m", state.queues["m"], w.requests, w.fair) is heads  # at the bound: kept
    heads.moved(state.queues["m"], gone, w.fair)
    rebuilt = w.heads.of("m", state.queues["m"], w.requests, w.fair)
    assert rebuilt is not heads and sum(len(h) for h in rebuilt.by_tag) == lanes
