"""Scheduler scenarios: arrival order across swaps, slots and concurrency, pools.

Each scenario is a list of (event, the commands ``step()`` must answer with); every intermediate state is also
checked with ``statemachine.check``. Model ``a`` and ``b`` share GPU 0 unless said otherwise.
"""

from __future__ import annotations

from statemachine import (
    ClientGone,
    Dispatch,
    ModelSpec,
    PoolSpec,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Tick,
    WakeAt,
)
from statemachine.queries import residents
from tests.support.scenario import a_b, evict, play, spawn


# ------------------------------------------------------------------------------------------------ ordering
def test_order_across_a_swap() -> None:
    """Long A, then B, then A: B waits for A to drain and A's second request waits behind B (A, B, A)."""
    # checks: INV-ORDER
    play(
        a_b(),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "b"), []),
            (RequestArrived(3, "a"), []),  # a has a free slot, but b holds GPU 0
            (RequestFinished(1), [evict(1, "a", "b")]),
            (ReplicaExited(1, "killed"), [spawn(2, "b", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), [evict(2, "b", "a")]),
            (ReplicaExited(2, "killed"), [spawn(3, "a", 3)]),
            (ReplicaReady(3), [Dispatch(3, 3, "a")]),
        ],
    )


def test_grace_lets_later_requests_pass_until_the_claim() -> None:
    """With queue_head_grace 2 s, requests for a still go ahead of the waiting b until t = 2."""
    # checks: LIVE-GRACE
    play(
        a_b(queue_head_grace=2.0),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "b"), [WakeAt(2.0)]),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),
            (Tick(1.0), []),
            (RequestFinished(3), []),
            (RequestArrived(4, "a"), [Dispatch(4, 1, "a")]),
            (Tick(2.0), []),  # b claims GPU 0 now
            (RequestArrived(5, "a"), []),
            (RequestFinished(1), []),
            (RequestFinished(4), [evict(1, "a", "b"), WakeAt(4.0)]),
            (ReplicaExited(1, "killed"), [spawn(2, "b", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
        ],
    )


def test_a_swap_never_blocks_other_gpus() -> None:
    # checks: INV-ORDER
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b"), ModelSpec("c", gpus=(1,))])
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "b"), []),
            (RequestArrived(3, "c"), [spawn(2, "c", 3, gpus=(1,))]),
            (RequestArrived(4, "a"), []),
            (ReplicaReady(2), [Dispatch(3, 2, "c")]),
        ],
    )


# ----------------------------------------------------------------------------------- slots and concurrency
def test_a_client_gone_frees_its_slot_at_once() -> None:
    # checks: INV-CANCEL
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), []),
            (RequestArrived(3, "a"), []),
            (ClientGone(3), []),  # a waiting request just leaves the queue
            (ClientGone(1), [Dispatch(2, 1, "a")]),  # the shell closed the exchange: the slot is free
        ],
    )


def test_concurrency_is_min_of_requests_and_slots() -> None:
    """Two replicas of two slots: four run at once, least-loaded replica first; the rest wait."""
    # checks: INV-SLOTS INV-LEAST-LOADED
    settings = Settings(models=[ModelSpec("a", replicas=2, slots=2)])
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            *[(RequestArrived(i, "a"), []) for i in range(2, 7)],
            (ReplicaReady(1), [Dispatch(1, 1, "a"), Dispatch(2, 1, "a")]),
            (ReplicaReady(2), [Dispatch(3, 2, "a"), Dispatch(4, 2, "a")]),
            (RequestFinished(3), [Dispatch(5, 2, "a")]),
            (RequestFinished(1), [Dispatch(6, 1, "a")]),
        ],
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), []),
            (RequestArrived(2, "a"), [Dispatch(2, 2, "a")]),  # fewest in flight
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),  # tie: lowest id
        ],
    )


def test_models_on_disjoint_gpus_are_co_resident() -> None:
    # checks: INV-CAP
    settings = Settings(models=[ModelSpec("a", gpus=(0,)), ModelSpec("b", gpus=(1,))])
    state = play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
        ],
    )
    assert residents(state, 0) == {"a"} and residents(state, 1) == {"b"}


# --------------------------------------------------------------------------------------------------- pools
def test_pool_goes_to_the_first_member_with_a_free_slot() -> None:
    """p falls back to b when a is busy; q (no fallback) waits for a."""
    # checks: INV-POOL-PRIORITY
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))],
        pools=[PoolSpec("p", ("a", "b"), fallback=True), PoolSpec("q", ("a", "b"))],
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(1), []),
            (RequestFinished(2), []),
            (RequestArrived(3, "p"), [Dispatch(3, 1, "a")]),  # primary first
            (RequestArrived(4, "p"), [Dispatch(4, 2, "b")]),  # fallback
            (RequestArrived(5, "p"), []),  # every member busy
            (RequestArrived(6, "q"), []),  # only a serves q
            (RequestFinished(4), [Dispatch(5, 2, "b")]),
            (RequestFinished(3), [Dispatch(6, 1, "a")]),
        ],
    )
