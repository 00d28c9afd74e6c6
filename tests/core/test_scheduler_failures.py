"""Scheduler scenarios: refusals, limits, crashes, unresponsive replicas and failed loads.

Each scenario is a list of (event, the commands ``step()`` must answer with); every intermediate state is also
checked with ``statemachine.check``. Model ``a`` and ``b`` share GPU 0 unless said otherwise.
"""

from __future__ import annotations

from statemachine import (
    DeviceSpec,
    Dispatch,
    Kill,
    KillCause,
    LoadFailed,
    ModelSpec,
    Policy,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    Spawn,
    Startup,
    UnloadRequested,
)
from tests.support.scenario import play, spawn


# ------------------------------------------------------------------------------------------------ refusals
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
                        RejectCode.MODEL_UNAVAILABLE,
                        "model 'big' cannot be loaded on GPU 0: " + pinned.format("big"),
                    )
                ],
            ),
            (
                RequestArrived(2, "b"),
                [
                    Reject(
                        2,
                        RejectCode.MODEL_UNAVAILABLE,
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
                [Reject(1, RejectCode.MODEL_UNAVAILABLE, f"model 'big' cannot be loaded on GPU 0: {budget}")],
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


def test_unknown_target_is_404_and_too_long_is_400_with_both_numbers() -> None:
    # checks: INV-ADMISSION
    settings = Settings(models=[ModelSpec("a", ctx_per_slot=4096)], pools=[PoolSpec("p", ("a",))])
    hint = "tokens (ctx / parallel); shorten the prompt or max_tokens, or raise the model's ctx"

    def too_long(rid: int, tokens: int, target: str) -> Reject:
        message = (
            f"the request needs {tokens} tokens but the largest per-slot context of '{target}' is 4096 {hint}"
        )
        return Reject(rid, RejectCode.CONTEXT_LENGTH_EXCEEDED, message)

    play(
        settings,
        [
            (
                RequestArrived(1, "zzz"),
                [Reject(1, RejectCode.MODEL_NOT_FOUND, "model 'zzz' is not served here; known models: a, p")],
            ),
            (RequestArrived(2, "a", tokens=5000), [too_long(2, 5000, "a")]),
            (RequestArrived(3, "p", tokens=4097), [too_long(3, 4097, "p")]),
            (RequestArrived(4, "a", tokens=4096), [spawn(1, "a", 4)]),
        ],
    )


# -------------------------------------------------------------------------------------------------- limits
def test_full_queue_rejects_with_503() -> None:
    # checks: INV-LIMITS INV-ADMISSION
    full = "the queue is full (1 requests waiting, queue_limit = 1); retry later"
    play(
        Settings(models=[ModelSpec("a")], policy=Policy(queue_limit=1)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "a"), [Reject(2, RejectCode.QUEUE_FULL, full)]),
        ],
    )


def test_queue_limit_zero_serves_only_what_can_go_at_once() -> None:
    # checks: INV-LIMITS INV-ADMISSION
    full = "the queue is full (0 requests waiting, queue_limit = 0); retry later"
    play(
        Settings(models=[ModelSpec("a", load_on_startup=True)], policy=Policy(queue_limit=0)),
        [
            (
                RequestArrived(1, "a"),
                [Reject(1, RejectCode.QUEUE_FULL, full)],
            ),  # nothing loaded, no load started
            (Startup(), [Spawn(1, "a", (0,), "load on startup")]),
            (RequestArrived(2, "a"), [Reject(2, RejectCode.QUEUE_FULL, full)]),
            (ReplicaReady(1), []),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),
            (RequestArrived(4, "a"), [Reject(4, RejectCode.QUEUE_FULL, full)]),
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
            (RequestArrived(2, "p"), [Reject(2, RejectCode.QUEUE_FULL, busy)]),
            (RequestArrived(3, "a"), []),
        ],
    )


# ------------------------------------------------------------------------------------------------ failures
def test_crash_fails_in_flight_requests_and_the_next_request_reloads() -> None:
    # checks: INV-CONSERVATION
    exited = "the replica of 'a' serving this request exited: segfault"
    play(
        Settings(models=[ModelSpec("a")]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaExited(1, "segfault"), [Reject(1, RejectCode.REPLICA_EXITED, exited)]),
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
                [
                    Kill(1, "a", "not responding: no answer to /health for 30 s", KillCause.UNRESPONSIVE),
                    spawn(2, "a", 2),
                ],
            ),
            (ReplicaUnresponsive(1, "no answer to /health for 40 s"), []),
            (ReplicaExited(1, "killed"), [Reject(1, RejectCode.REPLICA_EXITED, exited)]),
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
                    Kill(1, "a", "load failed: no /health after 600 s", KillCause.LOAD_FAILED),
                    Reject(1, RejectCode.LOAD_FAILED, failed),
                    Reject(2, RejectCode.LOAD_FAILED, failed),
                    spawn(3, "a", 3, "p"),
                ],
            ),
            (ReplicaReady(2), [Dispatch(3, 2, "b")]),
        ],
    )


def test_load_failure_keeps_waiters_while_another_replica_loads() -> None:
    """The failed replica is not replaced while the other one still loads; once that one is ready the model
    may grow again."""
    # checks: INV-LOAD-FAILURE INV-FAILING
    play(
        Settings(models=[ModelSpec("a", replicas=2)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (RequestArrived(2, "a"), []),
            (LoadFailed(1, "oom"), [Kill(1, "a", "load failed: oom", KillCause.LOAD_FAILED)]),
            (ReplicaExited(1, "stopped"), []),
            (ReplicaReady(2), [Dispatch(1, 2, "a"), spawn(3, "a", 2)]),
        ],
    )


def test_loads_that_keep_failing_do_not_chase_each_other() -> None:
    """Two replicas loading, both fail: the first failure starts no replacement, the second (no replica left
    alive) answers the waiters, and the next request tries again."""
    # checks: INV-LOAD-FAILURE INV-FAILING
    why = "model 'a' failed to load: bad flag"
    state = play(
        Settings(models=[ModelSpec("a", replicas=2)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (LoadFailed(1, "bad flag"), [Kill(1, "a", "load failed: bad flag", KillCause.LOAD_FAILED)]),
            (ReplicaExited(1, "stopped"), []),
            (
                LoadFailed(2, "bad flag"),
                [
                    Kill(2, "a", "load failed: bad flag", KillCause.LOAD_FAILED),
                    Reject(1, RejectCode.LOAD_FAILED, why),
                ],
            ),
            (ReplicaExited(2, "stopped"), []),
            (RequestArrived(2, "a"), [spawn(3, "a", 2), spawn(4, "a", 2)]),
        ],
    )
    assert not state.failing


def test_the_failing_mark_ends_when_no_replica_is_live_so_a_fresh_start_may_grow() -> None:
    """a (two replicas) is failing: replica 3 failed to load while 2 serves. 2 crashes: none is live, so the
    mark ends and request 2's load starts afresh; pinned p leaves room for one replica only. Once p is
    unloaded and gone, a second replica starts although the first has not loaded yet: a fresh start is not
    a failing one."""
    # checks: INV-FAILING
    models = [ModelSpec("p", pinned=True, need={0: 40}), ModelSpec("a", replicas=2, need={0: 40})]
    policy = Policy(max_models_per_gpu=2)
    smaller = Settings(models=models, devices=[DeviceSpec(0, 100)], policy=policy)
    state = play(
        Settings(models=models, devices=[DeviceSpec(0, 120)], policy=policy),
        [
            (Startup(), [Spawn(1, "p", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (RequestArrived(1, "a"), [spawn(2, "a", 1), spawn(3, "a", 1)]),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
            (
                LoadFailed(3, "out of memory"),
                [Kill(3, "a", "load failed: out of memory", KillCause.LOAD_FAILED)],
            ),
            (ReplicaExited(3, "stopped"), []),
            (SettingsChanged(smaller), []),  # room beside p for one replica of a only
            (RequestArrived(2, "a"), []),  # a is failing: no replica starts while 2 is live
            (
                ReplicaExited(2, "crashed"),
                [
                    Reject(
                        1,
                        RejectCode.REPLICA_EXITED,
                        "the replica of 'a' serving this request exited: crashed",
                    ),
                    spawn(4, "a", 2),
                ],
            ),
            (UnloadRequested("p"), [Kill(1, "p", "unload requested", KillCause.UNLOADED)]),
            (ReplicaExited(1, "stopped"), [spawn(5, "a", 2)]),
        ],
    )
    assert not state.failing


def test_startup_tops_up_a_model_a_failed_load_left_short_unless_it_is_failing() -> None:
    """Startup spawns the missing replicas of a load-on-startup model, also when some are live already; not
    while the model is failing (its last load failed and none of its replicas has been ready since)."""
    # checks: INV-FAILING
    play(
        Settings(models=[ModelSpec("a", replicas=2, load_on_startup=True)]),
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup"), Spawn(2, "a", (0,), "load on startup")]),
            (LoadFailed(2, "bad flag"), [Kill(2, "a", "load failed: bad flag", KillCause.LOAD_FAILED)]),
            (ReplicaExited(2, "stopped"), []),
            (Startup(), []),  # failing: replica 1 still loads
            (ReplicaReady(1), []),
            (Startup(), [Spawn(3, "a", (0,), "load on startup")]),
        ],
    )


def test_a_crash_while_loading_counts_as_a_failed_load() -> None:
    # checks: INV-FAILING
    state = play(
        Settings(models=[ModelSpec("a", replicas=2)]),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1), spawn(2, "a", 1)]),
            (ReplicaExited(1, "exit status 1 while loading"), []),
        ],
    )
    assert state.failing == {"a"}


def test_a_model_pinned_residents_leave_no_room_for_is_refused_with_the_pinned_ones_named() -> None:
    """Cap 1: pinned p holds GPU 0, so x can never load; the answer names p (not q, pinned on GPU 1), and a
    pool of x and y names its first member."""
    # checks: INV-UNSERVABLE INV-ANSWER
    settings = Settings(
        models=[
            ModelSpec("p", pinned=True),
            ModelSpec("q", gpus=(1,), pinned=True),
            ModelSpec("x"),
            ModelSpec("y"),
        ],
        pools=[PoolSpec("xy", ("x", "y"), fallback=True)],
    )
    message = (
        "model 'x' cannot be loaded on GPU 0: pinned model(s) p hold GPU 0 (max_models_per_gpu = 1); "
        "unpin them or give 'x' other GPUs"
    )
    play(
        settings,
        [
            (Startup(), [Spawn(1, "p", (0,), "load on startup"), Spawn(2, "q", (1,), "load on startup")]),
            (ReplicaReady(1), []),
            (ReplicaReady(2), []),
            (RequestArrived(1, "x"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, message)]),
            (RequestArrived(2, "xy"), [Reject(2, RejectCode.MODEL_UNAVAILABLE, message)]),
        ],
    )


def test_a_model_too_big_beside_the_pinned_ones_is_refused_for_memory() -> None:
    # checks: INV-UNSERVABLE INV-ANSWER
    settings = Settings(
        models=[
            ModelSpec("r", gpus=(1,), pinned=True, need={1: 40}),
            ModelSpec("big", gpus=(1,), need={1: 80}),
        ],
        devices=[DeviceSpec(1, 100)],
        policy=Policy(max_models_per_gpu=2),
    )
    message = (
        "model 'big' cannot be loaded on GPU 1: its memory need exceeds what the GPU budget leaves beside "
        "pinned models; choose a smaller quant or context"
    )
    play(
        settings,
        [
            (Startup(), [Spawn(1, "r", (1,), "load on startup")]),
            (ReplicaReady(1), []),
            (RequestArrived(1, "big"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, message)]),
        ],
    )


def test_too_long_for_every_pool_member_names_the_largest_context() -> None:
    """The 400 names the largest per-slot context among the members that could serve (not the smallest, not a
    refused member's)."""
    # checks: INV-ADMISSION INV-ANSWER
    settings = Settings(
        models=[
            ModelSpec("small", ctx_per_slot=1024),
            ModelSpec("large", ctx_per_slot=8192),
            ModelSpec("gone", ctx_per_slot=65536, refusal="placement: does not fit"),
        ],
        pools=[PoolSpec("p", ("small", "large", "gone"), fallback=True)],
        policy=Policy(max_models_per_gpu=2),
    )
    message = (
        "the request needs 9000 tokens but the largest per-slot context of 'p' is 8192 tokens "
        "(ctx / parallel); shorten the prompt or max_tokens, or raise the model's ctx"
    )
    play(
        settings,
        [(RequestArrived(1, "p", tokens=9000), [Reject(1, RejectCode.CONTEXT_LENGTH_EXCEEDED, message)])],
    )


def test_a_model_without_a_stated_need_takes_no_memory_beside_a_full_one() -> None:
    """a fills GPU 0's 100 bytes exactly; b states no need there, so it loads beside a."""
    # checks: INV-LOAD-FITS
    settings = Settings(
        models=[ModelSpec("a", need={0: 100}), ModelSpec("b")],
        devices=[DeviceSpec(0, 100)],
        policy=Policy(max_models_per_gpu=2),
    )
    assert ModelSpec("b").need_on(0) == 0
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
        ],
    )


def test_the_policy_defaults_are_the_documented_ones() -> None:
    """The same defaults as the router's configuration keys (router/config/schema.py); the router always
    passes its configured values, so only a test of the scheduler alone can pin these."""
    assert Policy() == Policy(
        max_models_per_gpu=1,
        eviction="lru",
        queue_head_grace=0.0,
        queue_force_load_timeout=300.0,
        queue_limit=1000,
        routing_queue_limit=32,
    )


def test_a_target_whose_every_candidate_is_refused_is_answered_with_the_refusals() -> None:
    # checks: INV-UNSERVABLE INV-ANSWER
    too_big, row_split = (
        "a: needs 30 GiB on GPU 0, which has 24",
        "b: row split over several GPUs is not modelled",
    )
    settings = Settings(
        models=[ModelSpec("a", refusal=too_big), ModelSpec("b", refusal=row_split)],
        pools=[PoolSpec("p", ("a", "b"), fallback=True)],
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, too_big)]),
            (RequestArrived(2, "p"), [Reject(2, RejectCode.MODEL_UNAVAILABLE, f"{too_big}; {row_split}")]),
        ],
    )
