"""The scheduler's behaviour in named situations, as exact command lists.

Each scenario is a list of (event, the commands ``step()`` must answer with); every intermediate state is also
checked with ``statemachine.check``. Model ``a`` and ``b`` share GPU 0 unless said otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from statemachine import (
    ClientGone,
    Command,
    DeviceSpec,
    Dispatch,
    DispatchFailed,
    Event,
    IllegalEvent,
    Kill,
    LoadFailed,
    ModelSpec,
    Policy,
    PoolSpec,
    Reject,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Spawn,
    Startup,
    State,
    Stopped,
    Tick,
    UnloadRequested,
    WakeAt,
    check,
    initial_state,
    step,
)

Script = Sequence[tuple[Event, Sequence[Command]]]


def play(settings: Settings, script: Script) -> State:
    state = initial_state(settings)
    for number, (event, expected) in enumerate(script):
        state, commands = step(state, event)
        check(state)
        assert list(commands) == list(expected), f"step {number}: {event}"
    return state


def spawn(
    replica: int, model: str, rid: int, target: str | None = None, gpus: tuple[int, ...] = (0,)
) -> Spawn:
    return Spawn(replica, model, gpus, f"request {rid} for '{target or model}'")


def evict(replica: int, model: str, new: str, policy: str = "lru", where: str = "0") -> Kill:
    return Kill(replica, model, f"evicted ({policy}) to load '{new}' on GPU {where}")


def shutting_down(rid: int) -> Reject:
    return Reject(rid, 503, "shutting_down", "the router is shutting down; retry shortly")


def a_b(**policy: object) -> Settings:
    return Settings(models=[ModelSpec("a", slots=2), ModelSpec("b")], policy=Policy(**policy))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- ordering
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


# ------------------------------------------------------------------------------ slots and concurrency
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
    assert state.residents(0) == {"a"} and state.residents(1) == {"b"}


# ----------------------------------------------------------------------------------------- eviction
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


def test_a_model_pinned_models_leave_no_room_for_is_refused_at_once() -> None:
    settings = Settings(
        models=[ModelSpec("big", need={0: 200}), ModelSpec("p", pinned=True), ModelSpec("b")],
        devices=[DeviceSpec(0, 100)],
    )
    pinned = "pinned model(s) p hold GPU 0 (max_models_per_gpu = 1); unpin them or give '{}' other GPUs"
    play(
        settings,
        [
            (Startup(), [Spawn(1, "p", (0,), "load on startup")]),
            (
                RequestArrived(1, "big"),
                [
                    Reject(
                        1,
                        503,
                        "model_unavailable",
                        "model 'big' cannot be loaded on GPU 0: " + pinned.format("big"),
                    )
                ],
            ),
            (
                RequestArrived(2, "b"),
                [
                    Reject(
                        2,
                        503,
                        "model_unavailable",
                        "model 'b' cannot be loaded on GPU 0: " + pinned.format("b"),
                    )
                ],
            ),
        ],
    )


def test_a_model_bigger_than_its_gpu_is_refused_at_once() -> None:
    budget = (
        "its memory need exceeds what the GPU budget leaves beside pinned models; "
        "choose a smaller quant or context"
    )
    play(
        Settings(models=[ModelSpec("big", need={0: 200})], devices=[DeviceSpec(0, 100)]),
        [
            (
                RequestArrived(1, "big"),
                [Reject(1, 503, "model_unavailable", f"model 'big' cannot be loaded on GPU 0: {budget}")],
            ),
        ],
    )


def test_a_second_replica_that_cannot_fit_leaves_requests_waiting_for_the_first() -> None:
    settings = Settings(models=[ModelSpec("a", replicas=2, need={0: 60})], devices=[DeviceSpec(0, 100)])
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),  # only one of the two replicas fits
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), []),
            (RequestFinished(1), [Dispatch(2, 1, "a")]),
        ],
    )


# ------------------------------------------------------------------------------------------ failures
def test_crash_fails_in_flight_requests_and_the_next_request_reloads() -> None:
    # checks: INV-CONSERVATION
    exited = "the replica of 'a' serving this request exited: segfault"
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaExited(1, "segfault"), [Reject(1, 502, "replica_exited", exited)]),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
        ],
    )


def test_an_unresponsive_replica_is_killed_at_once_and_the_next_request_reloads() -> None:
    """Killed busy; the waiting request gets a new replica; a late second report changes nothing."""
    # checks: INV-UNRESPONSIVE
    exited = "the replica of 'a' serving this request exited: killed"
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), []),
            (
                ReplicaUnresponsive(1, "no answer to /health for 30 s"),
                [Kill(1, "a", "not responding: no answer to /health for 30 s"), spawn(2, "a", 2)],
            ),
            (ReplicaUnresponsive(1, "no answer to /health for 40 s"), []),
            (ReplicaExited(1, "killed"), [Reject(1, 502, "replica_exited", exited)]),
            (ReplicaReady(2), [Dispatch(2, 2, "a")]),
        ],
    )


def test_load_failure_rejects_the_waiters_of_that_model_at_once() -> None:
    """Requests only a can serve fail with the reason; the pool request b can serve keeps waiting."""
    # checks: INV-LOAD-FAILURE
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b")],
        pools=[PoolSpec("p", ("a", "b"), fallback=True)],
        policy=Policy(max_models_per_gpu=2),
    )
    failed = "model 'a' failed to load: no /health after 600 s"
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "a"), []),
            (RequestArrived(3, "p"), [spawn(2, "b", 3, "p")]),
            (
                LoadFailed(1, "no /health after 600 s"),
                [
                    Kill(1, "a", "load failed: no /health after 600 s"),
                    Reject(1, 503, "load_failed", failed),
                    Reject(2, 503, "load_failed", failed),
                    spawn(3, "a", 3, "p"),
                ],
            ),
            (ReplicaReady(2), [Dispatch(3, 2, "b")]),
        ],
    )


def test_load_failure_keeps_waiters_while_another_replica_loads() -> None:
    # checks: INV-LOAD-FAILURE
    play(
        Settings(models=[ModelSpec("a", replicas=2)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (RequestArrived(2, "a"), []),
            (LoadFailed(1, "oom"), [Kill(1, "a", "load failed: oom"), spawn(3, "a", 1)]),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
        ],
    )


# -------------------------------------------------------------------------------------------- limits
def test_full_queue_rejects_with_503() -> None:
    # checks: INV-LIMITS INV-ADMISSION
    full = "the queue is full (1 requests waiting, queue_limit = 1); retry later"
    play(
        Settings(models=[ModelSpec("a")], policy=Policy(queue_limit=1)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "a"), [Reject(2, 503, "queue_full", full)]),
        ],
    )


def test_queue_limit_zero_serves_only_what_can_go_at_once() -> None:
    # checks: INV-LIMITS INV-ADMISSION
    full = "the queue is full (0 requests waiting, queue_limit = 0); retry later"
    play(
        Settings(models=[ModelSpec("a", load_on_startup=True)], policy=Policy(queue_limit=0)),
        [
            (RequestArrived(1, "a"), [Reject(1, 503, "queue_full", full)]),  # nothing loaded, no load started
            (Startup(), [Spawn(1, "a", (0,), "load on startup")]),
            (RequestArrived(2, "a"), [Reject(2, 503, "queue_full", full)]),
            (ReplicaReady(1), []),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),
            (RequestArrived(4, "a"), [Reject(4, 503, "queue_full", full)]),
        ],
    )


def test_pool_queue_has_its_own_limit() -> None:
    # checks: INV-LIMITS
    busy = (
        "every member of pool 'p' is busy and its waiting queue is full "
        "(routing_queue_limit = 1); retry later"
    )
    settings = Settings(
        models=[ModelSpec("a")], pools=[PoolSpec("p", ("a",))], policy=Policy(routing_queue_limit=1)
    )
    play(
        settings,
        [
            (RequestArrived(1, "p"), [spawn(1, "a", 1, "p")]),
            (RequestArrived(2, "p"), [Reject(2, 503, "queue_full", busy)]),
            (RequestArrived(3, "a"), []),
        ],
    )


def test_unknown_target_is_404_and_too_long_is_400_with_both_numbers() -> None:
    # checks: INV-ADMISSION
    settings = Settings(models=[ModelSpec("a", ctx_per_slot=4096)], pools=[PoolSpec("p", ("a",))])
    hint = "tokens (ctx / parallel); shorten the prompt or max_tokens, or raise the model's ctx"

    def too_long(rid: int, tokens: int, target: str) -> Reject:
        message = (
            f"the request needs {tokens} tokens but the largest per-slot context of '{target}' is 4096 {hint}"
        )
        return Reject(rid, 400, "context_length_exceeded", message)

    play(
        settings,
        [
            (
                RequestArrived(1, "zzz"),
                [Reject(1, 404, "model_not_found", "model 'zzz' is not served here; known models: a, p")],
            ),
            (RequestArrived(2, "a", tokens=5000), [too_long(2, 5000, "a")]),
            (RequestArrived(3, "p", tokens=4097), [too_long(3, 4097, "p")]),
            (RequestArrived(4, "a", tokens=4096), [spawn(1, "a", 4)]),
        ],
    )


# --------------------------------------------------------------------------------------------- pools
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


# ------------------------------------------------------------------------------------ unload and ttl
def test_unload_drains_busy_replicas_and_force_kills_them() -> None:
    # checks: INV-UNLOAD INV-KILL-IDLE
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    exited = "the replica of 'b' serving this request exited: killed"
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestArrived(3, "a"), []),
            (UnloadRequested(None), [spawn(3, "a", 3)]),  # the waiting request needs a fresh replica
            (RequestFinished(1), [Kill(1, "a", "unloaded")]),
            (UnloadRequested("b", force=True), [Kill(2, "b", "unload requested (forced)")]),
            (ReplicaExited(1, "killed"), []),
            (ReplicaExited(2, "killed"), [Reject(2, 502, "replica_exited", exited)]),
        ],
    )


def test_ttl_unloads_an_idle_model() -> None:
    play(
        Settings(models=[ModelSpec("a", ttl=5.0)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (Tick(1.0), []),
            (RequestFinished(1), [WakeAt(6.0)]),
            (Tick(3.0), []),
            (Tick(6.0), [Kill(1, "a", "idle for 5 s (ttl)")]),
        ],
    )


def test_a_refused_dispatch_waits_again_even_when_admitted_at_the_queue_limit() -> None:
    """With queue_limit 0 the request was admitted only because a slot was free; put back, it still waits."""
    # checks: INV-REDISPATCH
    play(
        Settings(models=[ModelSpec("a", load_on_startup=True)], policy=Policy(queue_limit=0)),
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (RequestArrived(1, "a"), [Dispatch(1, 1, "a")]),
            (DispatchFailed(1, "connection refused"), [spawn(2, "a", 1), Kill(1, "a", "unloaded")]),
            (ReplicaExited(1, "killed"), []),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
        ],
    )


# -------------------------------------------------------------------------------------------- reload
def test_reload_restarts_changed_models_and_keeps_the_others() -> None:
    """b gets two slots: its busy replica drains while a new one starts; a keeps serving; c is new."""
    # checks: INV-RELOAD INV-RETIRED
    old = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    new = Settings(
        models=[ModelSpec("a"), ModelSpec("b", gpus=(1,), slots=2), ModelSpec("c", gpus=(1,))],
        policy=Policy(max_models_per_gpu=2),
    )
    state = play(
        old,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestArrived(3, "b"), []),
            (SettingsChanged(new, frozenset({"b"})), [spawn(3, "b", 3, gpus=(1,))]),
            (RequestArrived(4, "c"), [spawn(4, "c", 4, gpus=(1,))]),
            (RequestFinished(2), [Kill(2, "b", "unloaded")]),
            (ReplicaExited(2, "killed"), []),
            (ReplicaReady(3), [Dispatch(3, 3, "b")]),
            (RequestArrived(5, "b"), [Dispatch(5, 3, "b")]),  # the new replica has two slots
            (RequestArrived(6, "a"), []),  # a kept its replica and its request
        ],
    )
    assert [(r.id, r.model) for r in state.replicas] == [(1, "a"), (3, "b"), (4, "c")]
    assert not state.retired


def test_reload_removing_a_model_answers_its_waiters_and_drains_it() -> None:
    # checks: INV-RELOAD
    old = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    new = Settings(models=[ModelSpec("a")])
    removed = "'b' was removed from the configuration while this request waited"
    state = play(
        old,
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1, gpus=(1,))]),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
            (ReplicaReady(1), [Dispatch(1, 1, "b")]),
            (RequestArrived(3, "b"), []),
            (
                SettingsChanged(new, frozenset({"b"})),
                [Reject(3, 404, "model_not_found", removed)],
            ),
            (
                RequestArrived(4, "b"),
                [Reject(4, 404, "model_not_found", "model 'b' is not served here; known models: a")],
            ),
            (RequestFinished(1), [Kill(1, "b", "unloaded")]),
            (ReplicaExited(1, "killed"), []),
            (
                SettingsChanged(Settings(models=[ModelSpec("z")]), frozenset()),
                [
                    Kill(2, "a", "removed from the configuration"),  # idle (still loading): killed at once
                    Reject(2, 404, "model_not_found", removed.replace("'b'", "'a'")),
                ],
            ),
        ],
    )
    assert [r.model for r in state.replicas] == ["a"] and list(state.retired) == [2]


# ------------------------------------------------------------------------------------------ shutdown
def test_shutdown_rejects_waiters_lets_work_finish_until_the_deadline() -> None:
    # checks: INV-SHUTDOWN LIVE-DEADLINE
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    exited = "the replica of 'a' serving this request exited: killed"
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(2), []),
            (RequestArrived(3, "a"), []),
            (
                ShutdownRequested(10.0),
                [shutting_down(3), Kill(2, "b", "router shutting down"), WakeAt(10.0)],
            ),
            (RequestArrived(4, "a"), [shutting_down(4)]),
            (Startup(), []),
            (Tick(5.0), []),
            (Tick(10.0), [Kill(1, "a", "router shutdown deadline reached")]),
            (ReplicaExited(2, "killed"), []),
            (ReplicaExited(1, "killed"), [Reject(1, 502, "replica_exited", exited), Stopped()]),
        ],
    )


def test_graceful_shutdown_stops_when_the_last_request_finishes() -> None:
    # checks: LIVE-STOP
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ShutdownRequested(30.0), [WakeAt(30.0)]),
            (RequestFinished(1), [Kill(1, "a", "router shutting down")]),
            (ReplicaExited(1, "killed"), [Stopped()]),
        ],
    )


# ------------------------------------------------------------------------------------- illegal events
def test_illegal_events_raise_and_leave_the_state_unchanged() -> None:
    # checks: INV-ILLEGAL
    state = play(
        Settings(models=[ModelSpec("a")]),
        [
            (Tick(1.0), []),
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "a"), []),
            (RequestArrived(3, "a"), []),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ClientGone(1), [Dispatch(2, 1, "a")]),
        ],
    )
    illegal: list[object] = [
        Tick(0.5),  # back in time
        RequestArrived(3, "a"),  # already waiting
        RequestFinished(3),  # not in flight
        RequestFinished(9),  # unknown
        ClientGone(1),  # already gone
        ClientGone(9),
        ReplicaReady(1),  # already ready
        LoadFailed(1, "x"),
        ReplicaReady(9),
        ReplicaExited(9, "x"),
        UnloadRequested("zzz"),
        "not an event",
    ]
    before = repr(state)
    for event in illegal:
        with pytest.raises(IllegalEvent):
            step(state, event)  # type: ignore[arg-type]
        assert repr(state) == before
    # the state still works: the running request finishes and the next one takes the slot
    state, commands = step(state, RequestFinished(2))
    assert list(commands) == [Dispatch(3, 1, "a")]


# ------------------------------------------------------------------------------- economy and choice
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
    assert state.used(0) == 100 and state.residents(0) == {"a", "c"}


def test_a_second_earlier_shutdown_deadline_wins() -> None:
    """Shutdown at 30, then at 10: the busy replica is killed at 10; a later third one changes nothing."""
    # checks: INV-SHUTDOWN INV-WAKE-EARLIEST
    exited = "the replica of 'a' serving this request exited: killed"
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ShutdownRequested(30.0), [WakeAt(30.0)]),
            (ShutdownRequested(10.0), [WakeAt(10.0)]),
            (ShutdownRequested(20.0), []),
            (Tick(10.0), [Kill(1, "a", "router shutdown deadline reached")]),
            (ReplicaExited(1, "killed"), [Reject(1, 502, "replica_exited", exited), Stopped()]),
        ],
    )


def test_a_reload_that_leaves_no_candidate_answers_a_refused_dispatch() -> None:
    """Pool p serves only through a; a reload refuses a: the queued pool request is answered 503 at once, and
    so is the running one when its dispatch turns out refused."""
    # checks: INV-UNSERVABLE INV-REDISPATCH INV-ANSWER
    old = Settings(models=[ModelSpec("a")], pools=[PoolSpec("p", ("a",))])
    new = Settings(
        models=[ModelSpec("a", refusal="placement: no longer fits")], pools=[PoolSpec("p", ("a",))]
    )
    unavailable = "no model can serve this request"
    play(
        old,
        [
            (RequestArrived(1, "p"), [spawn(1, "a", 1, "p")]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "p"), []),
            (SettingsChanged(new), [Reject(2, 503, "model_unavailable", unavailable)]),
            (
                DispatchFailed(1, "connection refused"),
                [Reject(1, 503, "model_unavailable", unavailable), Kill(1, "a", "unloaded")],
            ),
        ],
    )


def test_a_refused_dispatch_while_shutting_down_or_after_removal_is_answered() -> None:
    """A refused dispatch cannot wait again while the router stops (503) or once its model is gone (404)."""
    # checks: INV-REDISPATCH INV-ANSWER
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b", gpus=(1,))])
    start: list[tuple[Event, list[Command]]] = [
        (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
        (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
        (ReplicaReady(1), [Dispatch(1, 1, "a")]),
        (ReplicaReady(2), [Dispatch(2, 2, "b")]),
    ]
    play(
        settings,
        [
            *start,
            (ShutdownRequested(10.0), [WakeAt(10.0)]),
            (
                DispatchFailed(1, "connection refused"),
                [shutting_down(1), Kill(1, "a", "router shutting down")],
            ),
        ],
    )
    removed = "'b' was removed from the configuration and its replica refused the request"
    play(
        settings,
        [
            *start,
            (SettingsChanged(Settings(models=[ModelSpec("a")]), frozenset({"b"})), []),
            (
                DispatchFailed(2, "connection refused"),
                [Reject(2, 404, "model_not_found", removed), Kill(2, "b", "unloaded")],
            ),
        ],
    )


def test_refused_dispatches_keep_their_arrival_places() -> None:
    """Requests 1–3 run on a's three slots, 4 and 5 wait. Refused, 2 and then 1 go back in front of 4 and 5,
    and the new replica takes 1, 2, 4 in arrival order, then 5."""
    # checks: INV-REDISPATCH INV-QUEUE
    play(
        Settings(models=[ModelSpec("a", slots=3)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), [Dispatch(2, 1, "a")]),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),
            (RequestArrived(4, "a"), []),
            (RequestArrived(5, "a"), []),
            (DispatchFailed(2, "connection refused"), [spawn(2, "a", 2)]),
            (DispatchFailed(1, "connection refused"), []),
            (RequestFinished(3), [Kill(1, "a", "unloaded")]),
            (ReplicaExited(1, "killed"), []),
            (ReplicaReady(2), [Dispatch(1, 2, "a"), Dispatch(2, 2, "a"), Dispatch(4, 2, "a")]),
            (RequestFinished(1), [Dispatch(5, 2, "a")]),
        ],
    )


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
