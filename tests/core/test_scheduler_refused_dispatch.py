"""Scheduler scenarios: a dispatch the replica refused (DispatchFailed).

Each scenario is a list of (event, the commands ``step()`` must answer with); every intermediate state is also
checked with ``statemachine.check``. Model ``a`` and ``b`` share GPU 0 unless said otherwise.
"""

from __future__ import annotations

from statemachine import (
    Command,
    Dispatch,
    DispatchFailed,
    Event,
    Kill,
    KillCause,
    ModelSpec,
    Policy,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Spawn,
    Startup,
    WakeAt,
)
from tests.support.scenario import play, shutting_down, spawn


# -------------------------------------------------------------------------------------- refused dispatches
def test_a_refused_dispatch_waits_again_even_when_admitted_at_the_queue_limit() -> None:
    """With queue_limit 0 the request was admitted only because a slot was free; put back, it still waits."""
    # checks: INV-REDISPATCH
    play(
        Settings(models=[ModelSpec("a", load_on_startup=True)], policy=Policy(queue_limit=0)),
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (RequestArrived(1, "a"), [Dispatch(1, 1, "a")]),
            (
                DispatchFailed(1, "connection refused"),
                [spawn(2, "a", 1), Kill(1, "a", "unloaded", KillCause.DRAINED)],
            ),
            (ReplicaExited(1, "killed"), []),
            (ReplicaReady(2), [Dispatch(1, 2, "a")]),
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
            (SettingsChanged(new), [Reject(2, RejectCode.MODEL_UNAVAILABLE, unavailable)]),
            (
                DispatchFailed(1, "connection refused"),
                [
                    Reject(1, RejectCode.MODEL_UNAVAILABLE, unavailable),
                    Kill(1, "a", "unloaded", KillCause.DRAINED),
                ],
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
                [shutting_down(1), Kill(1, "a", "router shutting down", KillCause.SHUTDOWN)],
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
                [Reject(2, RejectCode.MODEL_NOT_FOUND, removed), Kill(2, "b", "unloaded", KillCause.DRAINED)],
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
            (RequestFinished(3), [Kill(1, "a", "unloaded", KillCause.DRAINED)]),
            (ReplicaExited(1, "killed"), []),
            (ReplicaReady(2), [Dispatch(1, 2, "a"), Dispatch(2, 2, "a"), Dispatch(4, 2, "a")]),
            (RequestFinished(1), [Dispatch(5, 2, "a")]),
        ],
    )


def test_a_refused_dispatch_of_a_removed_pool_still_drains_the_replica_that_refused() -> None:
    """The pool p goes in a reload but its member a stays: the refused request is answered 404, and the
    replica that refused the connection takes no more work, so the next request for a gets a new one."""
    # checks: INV-REDISPATCH INV-ANSWER
    old = Settings(models=[ModelSpec("a", slots=2)], pools=[PoolSpec("p", ("a",))])
    removed = "'p' was removed from the configuration and its replica refused the request"
    play(
        old,
        [
            (RequestArrived(1, "p"), [spawn(1, "a", 1, "p")]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (SettingsChanged(Settings(models=[ModelSpec("a", slots=2)])), []),
            (
                DispatchFailed(1, "connection refused"),
                [Reject(1, RejectCode.MODEL_NOT_FOUND, removed), Kill(1, "a", "unloaded", KillCause.DRAINED)],
            ),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
            (ReplicaExited(1, "killed"), []),
            (ReplicaReady(2), [Dispatch(2, 2, "a")]),
        ],
    )


def test_a_replica_that_broke_off_a_reply_takes_no_new_work() -> None:
    """Its connection reset mid-reply: the process may be dying before its exit is reported, so the next
    request loads another replica instead of going there; it is stopped once its other request ends."""
    # checks: INV-BROKEN
    play(
        Settings(models=[ModelSpec("a", slots=2, load_on_startup=True)]),
        [
            (Startup(), [Spawn(1, "a", (0,), "load on startup")]),
            (ReplicaReady(1), []),
            (RequestArrived(1, "a"), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a"), [Dispatch(2, 1, "a")]),
            (RequestFinished(1, broken="connection reset by peer"), []),
            (RequestArrived(3, "a"), [spawn(2, "a", 3)]),
            (RequestFinished(2), [Kill(1, "a", "unloaded", KillCause.DRAINED)]),
            (ReplicaReady(2), [Dispatch(3, 2, "a")]),
        ],
    )
