"""Scheduler scenarios: fewer swaps (statemachine/swaps.py) — batching per model, the hold for a client that
comes back, and the least residency.

Models ``a`` and ``b`` share GPU 0 (one model at a time); ``a`` has one slot unless said otherwise.
"""

from __future__ import annotations

from statemachine import (
    Dispatch,
    ModelSpec,
    Policy,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
    Tick,
    WakeAt,
    check,
    step,
)
from tests.support.scenario import evict, play, spawn


def settings(**policy: object) -> Settings:
    return Settings(models=[ModelSpec("a"), ModelSpec("b")], policy=Policy(**policy))  # type: ignore[arg-type]


def a_busy() -> list:
    """a is loaded and serves request 1 (t = 0..10: its load took 10 s)."""
    return [
        (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
        (Tick(10.0), []),
        (ReplicaReady(1), [Dispatch(1, 1, "a")]),
    ]


def test_the_resident_serves_its_waiting_requests_first_up_to_the_batch_bound() -> None:
    """b waits for the swap while a's requests keep coming: two of them go past b (swap_batch_max = 2), the
    third waits behind b's claim, and a is evicted once its work in flight is done. checks: INV-SWAP-BATCH"""
    play(
        settings(queue_head_grace=60.0, swap_batch_max=2),
        [
            *a_busy(),
            (RequestArrived(2, "b"), [WakeAt(70.0)]),
            (RequestArrived(3, "a"), []),
            (RequestArrived(4, "a"), []),
            (RequestArrived(5, "a"), []),
            (RequestFinished(1), [Dispatch(3, 1, "a")]),
            (RequestFinished(3), [Dispatch(4, 1, "a")]),
            (RequestFinished(4), [evict(1, "a", "b")]),  # b has let two go: it claims, 5 waits behind it
            (ReplicaExited(1, "evicted"), [spawn(2, "b", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
        ],
    )


def test_the_batch_ends_at_the_claim_time_whatever_its_count() -> None:
    """With room for ten, the batch still ends when b has waited queue_head_grace. checks: INV-SWAP-BATCH"""
    play(
        settings(queue_head_grace=5.0, swap_batch_max=10),
        [
            *a_busy(),
            (RequestArrived(2, "b"), [WakeAt(15.0)]),
            (RequestArrived(3, "a"), []),
            (RequestArrived(4, "a"), []),
            (RequestFinished(1), [Dispatch(3, 1, "a")]),
            (Tick(15.0), []),  # b claims: a takes nothing new
            (RequestFinished(3), [evict(1, "a", "b")]),
        ],
    )


def test_strict_order_without_batching() -> None:
    """queue_head_grace = 0: b claims at once, a's later requests wait behind it.
    checks: INV-SWAP-BATCH INV-ORDER"""
    play(
        settings(queue_head_grace=0.0, swap_batch_max=4),
        [
            *a_busy(),
            (RequestArrived(2, "b"), []),
            (RequestArrived(3, "a"), []),
            (RequestFinished(1), [evict(1, "a", "b")]),
        ],
    )


def test_the_idle_resident_is_held_for_its_client_to_come_back() -> None:
    """a's request ends while b waits: a is held 2 s; a's client comes back after 1 s and is served by a,
    without a swap; when a stays idle through the hold, b gets its swap. checks: INV-SWAP-HOLD"""
    play(
        settings(queue_head_grace=60.0, swap_batch_max=4, swap_hold=2.0),
        [
            *a_busy(),
            (RequestArrived(2, "b"), [WakeAt(70.0)]),
            (Tick(12.0), []),
            (RequestFinished(1), [WakeAt(14.0)]),  # held until 12 + 2
            (Tick(13.0), []),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a"), WakeAt(70.0)]),  # back within the hold
            (Tick(14.0), []),
            (RequestFinished(3), [WakeAt(16.0)]),
            (Tick(16.0), [evict(1, "a", "b"), WakeAt(70.0)]),  # the hold ran out
        ],
    )


def test_the_default_hold_is_a_tenth_of_the_measured_loads() -> None:
    """a's load took 10 s and b's was never seen: the hold is 1 s. checks: INV-SWAP-HOLD"""
    play(
        settings(queue_head_grace=60.0, swap_batch_max=4, swap_hold=None),
        [
            *a_busy(),
            (RequestArrived(2, "b"), [WakeAt(70.0)]),
            (Tick(12.0), []),
            (RequestFinished(1), [WakeAt(13.0)]),
            (Tick(13.0), [evict(1, "a", "b"), WakeAt(70.0)]),
        ],
    )


def test_nothing_is_held_once_the_waiter_claims() -> None:
    """An interactive request claims its swap at once: the idle resident goes without a hold.
    checks: INV-SWAP-HOLD"""
    play(
        settings(queue_head_grace=60.0, swap_batch_max=4, swap_hold=30.0),
        [
            *a_busy(),
            (RequestFinished(1), []),
            (RequestArrived(2, "b", klass=RequestClass.INTERACTIVE), [evict(1, "a", "b")]),
        ],
    )


def test_a_model_never_used_is_not_held() -> None:
    """a was loaded at startup and has served nothing: no client can come back to it, so b gets its swap at
    once. checks: INV-SWAP-HOLD"""
    models = [ModelSpec("a", load_on_startup=True), ModelSpec("b")]
    play(
        Settings(models=models, policy=Policy(queue_head_grace=60.0, swap_batch_max=4, swap_hold=30.0)),
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup", None)]),
            (ReplicaReady(1), []),
            (RequestArrived(2, "b"), [evict(1, "a", "b"), WakeAt(60.0)]),
        ],
    )


def test_a_young_model_stays_its_least_residency() -> None:
    """min_residency = 20: a, ready at t = 10, is evicted for b at t = 30; b, ready at t = 41, is not evicted
    for a before t = 61. checks: INV-MIN-RESIDENCY"""
    play(
        settings(queue_head_grace=0.0, min_residency=20.0),
        [
            *a_busy(),
            (RequestFinished(1), []),
            (RequestArrived(2, "b"), [WakeAt(30.0)]),
            (Tick(30.0), [evict(1, "a", "b")]),
            (ReplicaExited(1, "evicted"), [spawn(2, "b", 2)]),
            (Tick(41.0), []),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (RequestArrived(3, "a"), [WakeAt(61.0)]),
            (Tick(61.0), [evict(2, "b", "a")]),
        ],
    )


def test_a_request_past_its_maximum_wait_may_evict_a_young_model() -> None:
    """The least residency never starves a waiter: once past its class's maximum wait it
    evicts. checks: INV-MIN-RESIDENCY"""
    play(
        settings(queue_head_grace=0.0, min_residency=100.0, max_wait=(30.0, 5.0, 600.0)),
        [
            *a_busy(),
            (RequestFinished(1), []),
            (RequestArrived(2, "b"), [WakeAt(15.0)]),  # a stays until 110, or until b has waited 5 s
            (Tick(15.0), [evict(1, "a", "b")]),
        ],
    )


def test_an_old_resident_is_evicted_before_a_young_one_without_waiting_for_it() -> None:
    """Two models fit on GPU 0: a is old, c young (min_residency = 1). b evicts a at once, and nothing waits
    for the end of c's residency. checks: INV-MIN-RESIDENCY"""
    play(
        Settings(
            models=[ModelSpec("a"), ModelSpec("b"), ModelSpec("c")],
            policy=Policy(max_models_per_gpu=2, queue_head_grace=0.0, min_residency=1.0),
        ),
        [
            *a_busy(),
            (RequestFinished(1), []),
            (Tick(12.0), []),
            (RequestArrived(2, "c"), [spawn(2, "c", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "c")]),
            (RequestFinished(2), []),
            (Tick(12.5), []),
            (RequestArrived(3, "b"), [evict(1, "a", "b")]),
        ],
    )


def test_a_reload_that_lowers_the_batch_bound_makes_a_waiter_past_it_claim() -> None:
    """b has let two requests pass (bound 4); a reload lowers the bound to 1: b claims at once. A reload to
    the timed order (no bound) forgets the counts. checks: INV-SWAP-BATCH"""
    from statemachine import SettingsChanged

    before = settings(queue_head_grace=60.0, swap_batch_max=4)
    lowered = settings(queue_head_grace=60.0, swap_batch_max=1)
    state = play(
        before,
        [
            *a_busy(),
            (RequestArrived(2, "b"), [WakeAt(70.0)]),
            (RequestArrived(3, "a"), []),
            (RequestArrived(4, "a"), []),
            (RequestArrived(5, "a"), []),
            (RequestFinished(1), [Dispatch(3, 1, "a")]),
            (RequestFinished(3), [Dispatch(4, 1, "a")]),
        ],
    )
    assert dict(state.overtaken) == {2: 2}
    after, commands = step(state, SettingsChanged(lowered))
    check(after)
    assert dict(after.overtaken) == {2: 1}
    after, commands = step(after, RequestFinished(4))
    assert commands == (evict(1, "a", "b"), WakeAt(70.0))  # 5 waits behind b's claim until its own
    timed, _ = step(state, SettingsChanged(settings(queue_head_grace=60.0)))
    check(timed)
    assert dict(timed.overtaken) == {}


def test_a_request_that_passes_on_two_shared_gpus_counts_once() -> None:
    """b needs GPUs 0 and 1, where a (on both) is loaded: each request for a that goes first counts once,
    however many GPUs the two share. checks: INV-SWAP-BATCH"""
    models = [ModelSpec("a", gpus=(0, 1)), ModelSpec("b", gpus=(0, 1))]
    state = play(
        Settings(models=models, policy=Policy(queue_head_grace=60.0, swap_batch_max=4)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1, gpus=(0, 1))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "b"), [WakeAt(60.0)]),
            (RequestArrived(3, "a"), []),
            (RequestFinished(1), [Dispatch(3, 1, "a")]),
        ],
    )
    assert dict(state.overtaken) == {2: 1}


def test_the_batch_bound_holds_within_one_step() -> None:
    """a (three slots) becomes ready while b waits and three requests for a wait: the first (earlier than b)
    goes, then one more (swap_batch_max = 1), and the third waits behind b's claim. checks: INV-SWAP-BATCH"""
    models = [ModelSpec("a", slots=3), ModelSpec("b")]
    play(
        Settings(models=models, policy=Policy(queue_head_grace=60.0, swap_batch_max=1)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [WakeAt(60.0)]),
            (RequestArrived(3, "a"), []),
            (RequestArrived(4, "a"), []),
            (ReplicaReady(1), [Dispatch(1, 1, "a"), Dispatch(3, 1, "a")]),
        ],
    )


def test_the_hold_lasts_until_the_victim_used_last_may_go() -> None:
    """b needs GPUs 0 and 1, held by a (last used at t = 12) and c (at t = 11): the hold (2 s) ends at 14.
    checks: INV-SWAP-HOLD"""
    models = [ModelSpec("a"), ModelSpec("c", gpus=(1,)), ModelSpec("b", gpus=(0, 1))]
    play(
        Settings(models=models, policy=Policy(queue_head_grace=60.0, swap_batch_max=4, swap_hold=2.0)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "c"), [spawn(2, "c", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "c")]),
            (Tick(11.0), []),
            (RequestFinished(2), []),
            (Tick(12.0), []),
            (RequestFinished(1), []),
            (RequestArrived(3, "b"), [WakeAt(14.0)]),
            (Tick(14.0), [evict(1, "a", "b", gpus=(0, 1)), evict(2, "c", "b", gpus=(0, 1)), WakeAt(72.0)]),
        ],
    )


def test_a_model_younger_than_a_second_stays() -> None:
    """min_residency = 1: b, ready at t = 10, is not evicted at 10.5. checks: INV-MIN-RESIDENCY"""
    play(
        settings(queue_head_grace=0.0, min_residency=1.0),
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1)]),
            (Tick(10.0), []),
            (ReplicaReady(1), [Dispatch(1, 1, "b")]),
            (RequestFinished(1), []),
            (Tick(10.5), []),
            (RequestArrived(2, "a"), [WakeAt(11.0)]),
            (Tick(11.0), [evict(1, "b", "a")]),
        ],
    )


def test_a_replica_stopped_while_loading_does_not_make_its_model_young() -> None:
    """a's first replica failed its load and is stopping; its second has been ready long enough: a may be
    evicted for b. checks: INV-MIN-RESIDENCY"""
    from statemachine import Kill, KillCause, LoadFailed

    play(
        Settings(
            models=[ModelSpec("a", replicas=2), ModelSpec("b")],
            policy=Policy(queue_head_grace=0.0, min_residency=1.0),
        ),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (LoadFailed(1, "no /health"), [Kill(1, "a", "load failed: no /health", KillCause.LOAD_FAILED)]),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
            (RequestFinished(1), []),
            (Tick(5.0), []),
            (RequestArrived(2, "b"), [evict(2, "a", "b")]),
        ],
    )


def test_a_batch_bound_of_zero_claims_at_once() -> None:
    """swap_batch_max = 0 lets no request pass: strict order, whatever the grace. checks: INV-SWAP-BATCH"""
    play(
        settings(queue_head_grace=60.0, swap_batch_max=0),
        [
            *a_busy(),
            (RequestArrived(2, "b"), []),
            (RequestArrived(3, "a"), []),
            (RequestFinished(1), [evict(1, "a", "b")]),
        ],
    )
