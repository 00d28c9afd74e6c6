"""Scheduler scenarios: who is served first — priority classes, the maximum wait that ages a request ahead
of every class, fair share between keys by weight, and a swap claimed at once for an interactive request."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from statemachine import (
    Dispatch,
    Event,
    Forward,
    Kill,
    LoadFailed,
    ModelSpec,
    PeerSpec,
    Policy,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
    State,
    Tick,
    check,
    initial_state,
    step,
)

HIGH, STD, LOW = RequestClass.INTERACTIVE, RequestClass.STANDARD, RequestClass.BATCH


def loaded(settings: Settings) -> State:
    """The state once every pinned model's replicas are ready."""
    state, commands = step(initial_state(settings), Startup())
    for command in commands:
        assert isinstance(command, Spawn)
        state, _ = step(state, ReplicaReady(command.replica))
    return state


def feed(state: State, events: Sequence[Event]) -> tuple[State, list[int]]:
    """Feed ``events``; the requests dispatched, in order."""
    went: list[int] = []
    for event in events:
        state, commands = step(state, event)
        check(state)
        went += [c.rid for c in commands if isinstance(c, Dispatch)]
    return state, went


def one_slot(**policy: object) -> Settings:
    return Settings(
        models=[ModelSpec("m", pinned=True)],
        policy=Policy(**policy),  # type: ignore[arg-type]
        weights={"a": 2, "b": 1},
    )


def drain(state: State, first: int, count: int) -> tuple[State, list[int]]:
    """Finish the request in flight, then each one dispatched after it, ``count`` times."""
    order = [first]
    for _ in range(count):
        state, went = feed(state, [RequestFinished(order[-1])])
        assert len(went) == 1, went
        order += went
    return state, order[1:]


def test_a_free_slot_goes_to_the_best_class_then_to_arrival_order() -> None:
    # checks: INV-CLASS
    state = loaded(one_slot())
    arrivals = [
        RequestArrived(1, "m", klass=LOW),
        RequestArrived(2, "m", klass=LOW),
        RequestArrived(3, "m", klass=STD),
        RequestArrived(4, "m", klass=LOW),
        RequestArrived(5, "m", klass=HIGH),
        RequestArrived(6, "m", klass=STD),
    ]
    state, went = feed(state, arrivals)
    assert went == [1]  # the slot was free: the first comes first, whatever its class
    _, order = drain(state, 1, 5)
    assert order == [5, 3, 6, 2, 4]


def test_a_request_past_its_classes_maximum_wait_goes_before_every_class_oldest_first() -> None:
    # checks: INV-AGED
    state = loaded(one_slot(max_wait=(30.0, 20.0, 10.0)))
    state, went = feed(
        state,
        [
            RequestArrived(1, "m", klass=HIGH),
            RequestArrived(2, "m", klass=LOW),
            Tick(5.0),
            RequestArrived(3, "m", klass=STD),
            RequestArrived(4, "m", klass=HIGH),
            Tick(10.0),  # 2 has waited 10 s: a batch request's maximum
            RequestArrived(5, "m", klass=HIGH),
            Tick(25.0),  # 3 has waited 20 s: aged too, after 2; 4 (interactive, 20 s) is not yet
        ],
    )
    assert went == [1]
    _, order = drain(state, 1, 4)
    assert order == [2, 3, 4, 5]


def test_two_keys_waiting_for_one_slot_share_it_by_their_weights() -> None:
    # checks: INV-FAIR
    state = loaded(one_slot())
    arrivals = [RequestArrived(rid, "m", key="a") for rid in range(1, 8)]
    arrivals += [RequestArrived(rid, "m", key="b") for rid in range(11, 18)]
    state, went = feed(state, arrivals)
    assert went == [1]
    _, order = drain(state, 1, 9)
    keys = ["a" if rid < 10 else "b" for rid in order]
    assert keys.count("a") == 6 and keys.count("b") == 3, keys
    assert order[:3] == [11, 2, 3] or order[:3] == [2, 11, 3] or order[:3] == [2, 3, 11], order
    a_order = [rid for rid in order if rid < 10]
    assert a_order == sorted(a_order)  # within a key, arrival order


def test_a_key_the_settings_give_no_weight_shares_as_weight_one() -> None:
    """Anonymous requests (key "") and plain API keys have no weight of their own: they count as 1.
    checks: INV-FAIR"""
    state = loaded(Settings(models=[ModelSpec("m", pinned=True)], weights={"a": 1}))
    arrivals = [RequestArrived(rid, "m", key="a") for rid in range(1, 8)]
    arrivals += [RequestArrived(rid, "m", key="") for rid in range(11, 18)]
    state, went = feed(state, arrivals)
    assert went == [1]
    _, order = drain(state, 1, 8)
    keys = ["a" if rid < 10 else "" for rid in order]
    assert keys.count("a") == keys.count("") == 4, keys


def test_a_key_back_from_idle_starts_at_the_clock_instead_of_claiming_its_unused_share() -> None:
    # checks: INV-FAIR
    settings = Settings(models=[ModelSpec("m", pinned=True)], weights={"a": 1, "b": 1})
    state = loaded(settings)
    state, _ = feed(state, [RequestArrived(rid, "m", key="a") for rid in range(1, 8)])
    state, alone = drain(state, 1, 5)  # a is served alone five times; b waits for nothing meanwhile
    assert alone == [2, 3, 4, 5, 6]
    state, _ = feed(state, [RequestArrived(rid, "m", key="b") for rid in range(11, 15)])
    state, _ = feed(state, [RequestArrived(rid, "m", key="a") for rid in range(8, 11)])
    _, order = drain(state, 6, 6)
    # b starts at the clock, one dispatch ahead of a; from there they take turns, ties going to the earlier
    # arrival (b's came before a's second batch) — not b's four first, as an unused share would give.
    assert order == [11, 7, 12, 13, 8, 14], order


def test_an_interactive_request_claims_its_swap_at_once_and_work_in_flight_finishes() -> None:
    # checks: INV-CLASS
    settings = Settings(
        models=[ModelSpec("a"), ModelSpec("b")],
        policy=Policy(queue_head_grace=60.0),
    )
    state, commands = step(initial_state(settings), RequestArrived(1, "a"))
    (load,) = commands
    assert isinstance(load, Spawn)
    state, went = feed(state, [ReplicaReady(load.replica)])
    assert went == [1]
    # A standard request for b would let later requests for a pass for the head grace (60 s); an
    # interactive one holds GPU 0 at once: the request for a that comes after it waits, and a goes as soon
    # as its work in flight is done (never before).
    state, commands = step(state, RequestArrived(2, "b", klass=HIGH))
    assert not [c for c in commands if isinstance(c, Kill)]
    state, went = feed(state, [RequestArrived(3, "a")])
    assert went == []
    state, commands = step(state, RequestFinished(1))
    kills = [c for c in commands if isinstance(c, Kill)]
    assert [k.replica for k in kills] == [load.replica] and not [
        c for c in commands if isinstance(c, Dispatch)
    ]
    state, commands = step(state, ReplicaExited(load.replica, "stopped"))
    spawns = [c for c in commands if isinstance(c, Spawn)]
    assert [(s.model, s.request) for s in spawns] == [("b", 2)]


def test_a_standard_request_waits_its_grace_before_it_claims_a_swap() -> None:
    # checks: INV-CLASS
    settings = Settings(models=[ModelSpec("a"), ModelSpec("b")], policy=Policy(queue_head_grace=60.0))
    state, commands = step(initial_state(settings), RequestArrived(1, "a"))
    state, went = feed(state, [ReplicaReady(commands[0].replica), RequestArrived(2, "b")])  # type: ignore[union-attr]
    state, went = feed(state, [RequestArrived(3, "a"), RequestFinished(1)])
    assert went == [3]  # within the grace, a later request for the resident model still passes


def test_keys_back_from_idle_are_equals_at_the_clock_whatever_they_used_long_ago() -> None:
    # checks: INV-FAIR
    settings = Settings(models=[ModelSpec("m", pinned=True)])
    state = loaded(settings)
    state, _ = feed(state, [RequestArrived(1, "m", key="d")])
    state, _ = feed(state, [RequestArrived(rid, "m", key="a") for rid in range(2, 9)])
    state, _ = drain(state, 1, 5)  # d was served once, long ago; a five times since
    state, _ = feed(state, [RequestArrived(20, "m", key="d"), RequestArrived(21, "m", key="c")])
    _, order = drain(state, 6, 2)
    assert order == [20, 21]  # both re-enter at the clock: arrival order decides, not d's old service


def test_slots_freed_at_once_go_to_the_keys_in_turn() -> None:
    # checks: INV-FAIR
    settings = Settings(models=[ModelSpec("m", slots=3)])
    state, commands = step(initial_state(settings), RequestArrived(1, "m", key="a"))
    (load,) = commands
    assert isinstance(load, Spawn)
    arrivals = [
        RequestArrived(2, "m", key="a"),
        RequestArrived(3, "m", key="b"),
        RequestArrived(4, "m", key="b"),
    ]
    state, went = feed(state, [*arrivals, ReplicaReady(load.replica)])
    assert went == [1, 3, 2]  # one pass, three slots: a, then b (a's tag moved on), then a again


def test_an_aged_request_goes_before_an_older_interactive_one_that_has_not_aged() -> None:
    # checks: INV-AGED
    state = loaded(one_slot(max_wait=(100.0, 10.0, 600.0)))
    state, went = feed(
        state,
        [
            RequestArrived(1, "m", key="x"),  # takes the slot; the clock's tags stay at 0 for new keys
            RequestArrived(2, "m", key="a", klass=HIGH),
            RequestArrived(3, "m", key="b", klass=STD),
            Tick(10.0),  # 3 has waited a standard request's maximum; 2 is far from an interactive one's
        ],
    )
    assert went == [1]
    _, order = drain(state, 1, 2)
    assert order == [3, 2]


def test_keys_waiting_for_a_peer_take_its_places_in_turn() -> None:
    # checks: INV-FAIR
    settings = Settings(
        models=[ModelSpec("far", gpus=(), peer="box")],
        peers=[PeerSpec("box", max_in_flight=1)],
        weights={"a": 1, "b": 1},
    )
    state = initial_state(settings)
    went: list[int] = []
    for event in [RequestArrived(rid, "far", key="a") for rid in range(1, 5)] + [
        RequestArrived(rid, "far", key="b") for rid in range(11, 13)
    ]:
        state, commands = step(state, event)
        went += [c.rid for c in commands if isinstance(c, Forward)]
    assert went == [1]
    for _ in range(5):
        state, commands = step(state, RequestFinished(went[-1]))
        check(state)
        went += [c.rid for c in commands if isinstance(c, Forward)]
    # each forward moves its key's tag on, as a dispatch here does: b is not left behind a's backlog
    assert went == [1, 11, 2, 12, 3, 4], went


def _refused(state: State, event: Event) -> tuple[State, list[Reject]]:
    state, commands = step(state, event)
    check(state)
    return state, [c for c in commands if isinstance(c, Reject)]


def test_a_key_past_its_max_queued_is_refused_and_others_are_not() -> None:
    # checks: INV-KEY-QUEUE
    settings = Settings(models=[ModelSpec("m", pinned=True)], max_queued={"a": 2})
    state = loaded(settings)
    state, _ = feed(state, [RequestArrived(rid, "m", key="a") for rid in (1, 2, 3)])  # 1 runs, 2 and 3 wait
    state, refused = _refused(state, RequestArrived(4, "m", key="a"))
    assert [(r.rid, r.code) for r in refused] == [(4, RejectCode.KEY_QUEUE_FULL)]
    assert "max_queued = 2" in refused[0].message and "'a'" in refused[0].message
    state, refused = _refused(state, RequestArrived(5, "m", key="b"))  # another key is not held back
    assert refused == []
    state, went = feed(state, [RequestFinished(1), RequestFinished(5)])
    assert went == [5, 2]  # b's turn first (a was served once), then a's
    state, refused = _refused(state, RequestArrived(6, "m", key="a"))  # one of a's went: room again
    assert refused == [] and state.queued_by_key == {"a": 2}


def test_the_whole_queue_limit_is_checked_before_a_keys_own() -> None:
    # checks: INV-KEY-QUEUE, INV-LIMITS
    settings = Settings(
        models=[ModelSpec("m", pinned=True)], policy=Policy(queue_limit=1), max_queued={"a": 1}
    )
    state = loaded(settings)
    state, _ = feed(state, [RequestArrived(1, "m", key="b"), RequestArrived(2, "m", key="a")])
    state, refused = _refused(state, RequestArrived(3, "m", key="a"))
    assert [r.code for r in refused] == [RejectCode.QUEUE_FULL]


def test_a_request_that_can_go_at_once_is_never_refused_for_its_key() -> None:
    # checks: INV-KEY-QUEUE
    settings = Settings(models=[ModelSpec("m", pinned=True, slots=2)], max_queued={"a": 0})
    state = loaded(settings)
    state, went = feed(state, [RequestArrived(1, "m", key="a"), RequestArrived(2, "m", key="a")])
    assert went == [1, 2]
    state, refused = _refused(state, RequestArrived(3, "m", key="a"))
    assert [r.code for r in refused] == [RejectCode.KEY_QUEUE_FULL]


def _pool(**policy: object) -> Settings:
    return Settings(
        models=[ModelSpec("a", gpus=(0,)), ModelSpec("b", gpus=(1,))],
        pools=[PoolSpec("p", ("a", "b"), fallback=True)],
        policy=Policy(**policy),  # type: ignore[arg-type]
    )


def test_a_pool_member_outside_the_keys_scope_is_never_loaded_nor_dispatched_to() -> None:
    # checks: INV-SCOPE
    state, commands = step(initial_state(_pool()), RequestArrived(1, "p", outside=frozenset({"a"})))
    assert [(c.model, c.request) for c in commands if isinstance(c, Spawn)] == [("b", 1)]
    (load,) = commands
    state, commands = step(state, ReplicaReady(load.replica))  # type: ignore[union-attr]
    assert commands == (Dispatch(1, load.replica, "b"),)  # type: ignore[union-attr]
    # b is busy; a request that may use only a waits for a (loads it), never takes b
    state, commands = step(state, RequestArrived(2, "p", outside=frozenset({"b"})))
    assert [(c.model, c.request) for c in commands if isinstance(c, Spawn)] == [("a", 2)]


def test_a_load_failure_of_its_only_member_in_scope_fails_a_pooled_request() -> None:
    # checks: INV-SCOPE, INV-LOAD-FAILURE
    state, commands = step(initial_state(_pool()), RequestArrived(1, "p", outside=frozenset({"b"})))
    (load,) = commands
    assert isinstance(load, Spawn) and load.model == "a"
    state, commands = step(state, RequestArrived(2, "p"))  # may use b: waits on, or loads b
    state, commands = step(state, LoadFailed(load.replica, "out of memory"))
    rejected = [c.rid for c in commands if isinstance(c, Reject)]
    assert rejected == [1]


def test_many_keys_of_one_class_take_turns_through_the_heaps() -> None:
    # checks: INV-FAIR
    keys = [f"k{i}" for i in range(6)]  # more lanes than are ranked one by one: the heaps order them
    state = loaded(Settings(models=[ModelSpec("m", pinned=True)]))
    arrivals = [RequestArrived(10 * i + n, "m", key=key) for n in range(1, 4) for i, key in enumerate(keys)]
    state, went = feed(state, arrivals)
    assert went == [1]  # k0's first took the free slot
    _, order = drain(state, 1, len(arrivals) - 1)
    # round by round, every key once, in the order the keys' first requests came (k0 was served first)
    assert order[:5] == [11, 21, 31, 41, 51], order
    assert order[5:11] == [2, 12, 22, 32, 42, 52], order


def test_a_step_from_an_older_state_answers_as_from_a_fresh_one() -> None:
    # checks: INV-DETERMINISM
    keys = [f"k{i}" for i in range(6)]
    state = loaded(Settings(models=[ModelSpec("m", pinned=True)]))
    state, _ = feed(
        state, [RequestArrived(10 * i + n, "m", key=k) for n in (1, 2) for i, k in enumerate(keys)]
    )
    older = state
    state, _ = feed(state, [RequestFinished(1), RequestFinished(11)])  # moves the shared index on
    again, commands = step(older, RequestFinished(1))
    fresh, fresh_commands = step(attrs.evolve(older, heads=None), RequestFinished(1))
    assert commands == fresh_commands and again == fresh
