"""Scheduler scenarios: which residents are evicted for a swap, and when.

Each scenario is a list of (event, the commands ``step()`` must answer with); every intermediate state is also
checked with ``statemachine.check``. Model ``a`` and ``b`` share GPU 0 unless said otherwise.
"""

from __future__ import annotations

import pytest

from statemachine import (
    Command,
    DeviceSpec,
    Dispatch,
    Event,
    ModelSpec,
    Policy,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
    Tick,
    WakeAt,
)
from statemachine.queries import residents, used
from tests.support.scenario import evict, play, spawn


# ------------------------------------------------------------------------------------------------- victims
@pytest.mark.parametrize(("eviction", "victim"), [("lru", (2, "b")), ("fifo", (1, "a"))])
def test_lru_and_fifo_choose_different_victims(eviction: str, victim: tuple[int, str]) -> None:
    """a is loaded first but used last: lru evicts b (oldest last request), fifo evicts a (earliest load)."""
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b"), ModelSpec("c")],
        policy=Policy(max_models_per_gpu=2, eviction=eviction),
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(1), []),
            (Tick(1.0), []),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (Tick(2.0), []),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),
            (RequestFinished(3), []),
            (Tick(3.0), []),
            (RequestArrived(4, "c"), [evict(*victim, "c", eviction)]),
        ],
    )


def test_residents_with_queued_work_are_evicted_last() -> None:
    """a is the least recently used, but a request waits for it: b goes instead."""
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b"), ModelSpec("c")], policy=Policy(max_models_per_gpu=2)
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (Tick(1.0), []),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (RequestArrived(3, "a"), []),
            (RequestArrived(4, "c"), [evict(2, "b", "c")]),
            (RequestFinished(1), [Dispatch(3, 1, "a")]),
        ],
    )


def test_a_model_an_earlier_request_waits_for_is_not_evicted() -> None:
    """b is pinned, so only a could make room for c; a request for a came first, so c waits for it."""
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b", pinned=True), ModelSpec("c")],
        policy=Policy(max_models_per_gpu=2),
    )
    play(
        settings,
        [
            (Startup(), [Spawn(1, "b", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (RequestArrived(1, "a"), [spawn(2, "a", 1)]),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
            (RequestArrived(2, "a"), []),
            (RequestArrived(3, "c"), []),
            (RequestFinished(1), [Dispatch(2, 2, "a")]),
            (RequestFinished(2), [evict(2, "a", "c")]),
            (ReplicaExited(2, "killed"), [spawn(3, "c", 3)]),
            (ReplicaReady(3), [Dispatch(3, 3, "c")]),
        ],
    )


def test_pinned_models_are_never_evicted() -> None:
    """p is pinned and the least recently used; a goes instead."""
    settings = Settings(
        models=[ModelSpec("p", pinned=True), ModelSpec("a"), ModelSpec("c")],
        policy=Policy(max_models_per_gpu=2),
    )
    play(
        settings,
        [
            (Startup(), [Spawn(1, "p", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (Tick(1.0), []),
            (RequestArrived(1, "a"), [spawn(2, "a", 1)]),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
            (RequestFinished(1), []),
            (RequestArrived(2, "c"), [evict(2, "a", "c")]),
        ],
    )


def _three_residents(eviction: str) -> Settings:
    """a, b, c take 30 of GPU 0's 100 bytes each; d needs 60, so two of them must go."""
    return Settings(
        models=[*(ModelSpec(name, need={0: 30}) for name in "abc"), ModelSpec("d", need={0: 60})],
        devices=[DeviceSpec(0, 100)],
        policy=Policy(max_models_per_gpu=4, eviction=eviction),
    )


@pytest.mark.parametrize(
    ("eviction", "victims"), [("lru", ((2, "c"), (1, "b"))), ("fifo", ((1, "b"), (2, "c")))]
)
def test_victim_order_with_three_residents(eviction: str, victims: tuple[tuple[int, str], ...]) -> None:
    """Loaded b, c, a; last used c (t=1), b (t=3), a (t=4). lru evicts c then b, fifo b then c; a stays in
    both (name order would have evicted a first)."""
    # checks: INV-VICTIM INV-EVICT-NEED
    play(
        _three_residents(eviction),
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "b")]),
            (RequestFinished(1), []),
            (Tick(1.0), []),
            (RequestArrived(2, "c"), [spawn(2, "c", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "c")]),
            (RequestFinished(2), []),
            (Tick(2.0), []),
            (RequestArrived(3, "a"), [spawn(3, "a", 3)]),
            (ReplicaReady(3), [Dispatch(3, 3, "a")]),
            (RequestFinished(3), []),
            (Tick(3.0), []),
            (RequestArrived(4, "b"), [Dispatch(4, 1, "b")]),
            (RequestFinished(4), []),
            (Tick(4.0), []),
            (RequestArrived(5, "a"), [Dispatch(5, 3, "a")]),
            (RequestFinished(5), []),
            (Tick(5.0), []),
            (RequestArrived(6, "d"), [evict(*victim, "d", eviction) for victim in victims]),
            (ReplicaExited(victims[0][0], "killed"), []),
            (ReplicaExited(victims[1][0], "killed"), [spawn(4, "d", 6)]),
        ],
    )


# ---------------------------------------------------------------------------------------------------- when
def _two_replicas_of_a() -> list[tuple[Event, list[Command]]]:
    """a has two replicas on GPU 0: request 1 runs on replica 1, replica 2 served request 2 and is idle."""
    return [
        (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
        (ReplicaReady(1), [Dispatch(1, 1, "a")]),
        (ReplicaReady(2), []),
        (RequestArrived(2, "a"), [Dispatch(2, 2, "a")]),
        (RequestFinished(2), []),
    ]


def test_a_busy_victim_is_evicted_only_at_the_claim() -> None:
    """With grace 2 s, b arrives while a still serves request 1: nothing is killed before t = 2; at the claim
    the idle replica goes, the busy one when its request ends."""
    # checks: INV-EVICT-NEED INV-WAKE-EARLIEST
    settings = Settings(
        models=[ModelSpec("a", replicas=2), ModelSpec("b")], policy=Policy(queue_head_grace=2.0)
    )
    play(
        settings,
        [
            *_two_replicas_of_a(),
            (RequestArrived(3, "b"), [WakeAt(2.0)]),
            (Tick(1.0), []),
            (Tick(2.0), [evict(2, "a", "b")]),
            (RequestFinished(1), [evict(1, "a", "b")]),
            (ReplicaExited(2, "killed"), []),
            (ReplicaExited(1, "killed"), [spawn(3, "b", 3)]),
        ],
    )


def test_idle_victims_are_evicted_at_once_before_the_claim() -> None:
    """The same, but a is idle when b arrives: both replicas go at once, and b is loaded before its claim."""
    # checks: INV-EVICT-NEED INV-WAKE-EARLIEST
    settings = Settings(
        models=[ModelSpec("a", replicas=2), ModelSpec("b")], policy=Policy(queue_head_grace=2.0)
    )
    play(
        settings,
        [
            *_two_replicas_of_a(),
            (RequestFinished(1), []),
            (RequestArrived(3, "b"), [evict(1, "a", "b"), evict(2, "a", "b"), WakeAt(2.0)]),
            (ReplicaExited(1, "killed"), []),
            (ReplicaExited(2, "killed"), [spawn(3, "b", 3)]),
        ],
    )


def test_an_exact_fit_is_loaded_beside_the_resident() -> None:
    """40 + 60 = 100 fits a 100-byte GPU; later c (60) needs room, and evicting b (lru) alone leaves exactly
    enough beside a."""
    # checks: INV-LOAD-FITS INV-EVICT-NEED INV-VICTIM
    settings = Settings(
        models=[ModelSpec("a", need={0: 40}), ModelSpec("b", need={0: 60}), ModelSpec("c", need={0: 60})],
        devices=[DeviceSpec(0, 100)],
        policy=Policy(max_models_per_gpu=3),
    )
    state = play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (Tick(1.0), []),
            (RequestFinished(1), []),
            (RequestArrived(3, "c"), [evict(2, "b", "c")]),
            (ReplicaExited(2, "killed"), [spawn(3, "c", 3)]),
        ],
    )
    assert used(state, 0) == 100 and residents(state, 0) == {"a", "c"}


# ----------------------------------------------------------------------------------------------------- age
def test_lru_age_counts_the_last_dispatch() -> None:
    """b was loaded and finished first, but a request was dispatched to it at t = 2 and still runs: its age
    is 2, so lru evicts a (last finished at 1), which is idle and goes at once."""
    # checks: INV-VICTIM
    play(
        Settings(models=[ModelSpec(name) for name in "abcd"], policy=Policy(max_models_per_gpu=3)),
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "b")]),
            (RequestFinished(1), []),
            (Tick(1.0), []),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "a")]),
            (RequestFinished(2), []),
            (Tick(1.5), []),
            (RequestArrived(3, "c"), [spawn(3, "c", 3)]),
            (ReplicaReady(3), [Dispatch(3, 3, "c")]),
            (RequestFinished(3), []),
            (Tick(2.0), []),
            (RequestArrived(4, "b"), [Dispatch(4, 1, "b")]),
            (Tick(3.0), []),
            (RequestArrived(5, "d"), [evict(2, "a", "d")]),
            (ReplicaExited(2, "killed"), [spawn(4, "d", 5)]),
        ],
    )


def test_a_resident_with_later_queued_work_goes_after_an_idle_one() -> None:
    """c waits (grace 5 s) to replace a, the least recently used, which is busy. A later request for a then
    queues: a now has queued work, so b goes instead, at once (it is idle). The later request does not
    protect a (it came after c's), so only the queued-work rule decides."""
    # checks: INV-VICTIM
    settings = Settings(
        models=[ModelSpec(name) for name in "abc"], policy=Policy(max_models_per_gpu=2, queue_head_grace=5.0)
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (Tick(1.0), []),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (Tick(2.0), []),
            (RequestArrived(3, "c"), [WakeAt(7.0)]),  # a is the victim, but busy: nothing yet
            (Tick(3.0), []),
            (RequestArrived(4, "a"), [evict(2, "b", "c")]),
            (ReplicaExited(2, "killed"), [spawn(3, "c", 3)]),
            (ReplicaReady(3), [Dispatch(3, 3, "c")]),
        ],
    )


def test_fifo_age_starts_again_when_a_model_comes_back() -> None:
    """a is loaded first and evicted; loaded again at t = 3 it is the youngest resident, so fifo evicts c
    (loaded at 2) for b, not a."""
    # checks: INV-VICTIM
    settings = Settings(
        models=[ModelSpec(name) for name in "abc"], policy=Policy(max_models_per_gpu=2, eviction="fifo")
    )
    served = [(ReplicaReady(r), [Dispatch(r, r, m)]) for r, m in ((1, "a"), (2, "b"), (3, "c"), (4, "a"))]
    state = play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            served[0],
            (RequestFinished(1), []),
            (Tick(1.0), []),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
            served[1],
            (RequestFinished(2), []),
            (Tick(2.0), []),
            (RequestArrived(3, "c"), [evict(1, "a", "c", "fifo")]),
            (ReplicaExited(1, "killed"), [spawn(3, "c", 3)]),
            served[2],
            (RequestFinished(3), []),
            (Tick(3.0), []),
            (RequestArrived(4, "a"), [evict(2, "b", "a", "fifo")]),
            (ReplicaExited(2, "killed"), [spawn(4, "a", 4)]),
            served[3],
            (RequestFinished(4), []),
            (Tick(4.0), []),
            (RequestArrived(5, "b"), [evict(3, "c", "b", "fifo")]),
        ],
    )
    assert dict(state.loaded_at) == {"a": 3.0, "c": 2.0}


def test_a_request_behind_an_earlier_claim_neither_evicts_nor_holds_other_gpus() -> None:
    """b's request claims GPU 0 at t = 2 (a is busy there). c spans GPUs 0 and 1: it waits behind that claim,
    and until its own claim (t = 3) it holds neither GPU, so d on GPU 1 keeps serving; at its claim it evicts
    nothing, since it cannot load before b anyway, but from then on it holds GPU 1 against later requests."""
    # checks: INV-EVICT-NEED INV-ORDER
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b"), ModelSpec("c", gpus=(0, 1)), ModelSpec("d", gpus=(1,))],
        policy=Policy(queue_head_grace=2.0),
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "d"), [spawn(2, "d", 2, gpus=(1,))]),
            (ReplicaReady(2), [Dispatch(2, 2, "d")]),
            (RequestFinished(2), []),
            (RequestArrived(3, "b"), [WakeAt(2.0)]),
            (Tick(1.0), []),
            (RequestArrived(4, "c"), []),
            (Tick(2.0), [WakeAt(3.0)]),  # b claims GPU 0; c's claim is due at 3
            (Tick(2.5), []),
            (RequestArrived(5, "d"), [Dispatch(5, 2, "d")]),  # GPU 1 is not held by the waiting c
            (RequestFinished(5), []),
            (Tick(3.0), []),  # c claims, but behind b: d is not evicted for it
            (RequestArrived(6, "d"), []),  # from its claim on, c holds GPU 1 as well
            (RequestFinished(1), [evict(1, "a", "b")]),
            (ReplicaExited(1, "killed"), [spawn(3, "b", 3)]),
        ],
    )


def test_a_model_never_used_ages_from_its_load() -> None:
    """a was loaded at startup and never asked for; b served a request that ended at t = 2. For c, lru takes
    a: its age is its load time (t = 0), older than b's last use."""
    # checks: INV-VICTIM
    settings = Settings(
        models=[ModelSpec("a", load_on_startup=True), ModelSpec("b"), ModelSpec("c")],
        policy=Policy(max_models_per_gpu=2),
    )
    play(
        settings,
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (Tick(1.0), []),
            (RequestArrived(1, "b"), [spawn(2, "b", 1)]),
            (ReplicaReady(2), [Dispatch(1, 2, "b")]),
            (Tick(2.0), []),
            (RequestFinished(1), []),
            (Tick(3.0), []),
            (RequestArrived(2, "c"), [evict(1, "a", "c")]),
        ],
    )
