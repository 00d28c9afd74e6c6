"""``statemachine.check`` itself: each state invariant fires on a state broken on purpose, and only there.

The scheduler's tests feed ``check()`` the states ``step()`` produces, which are correct, so a check that
stopped firing would go unnoticed there; here every check is shown a state that violates it (and, where a
boundary matters, one that just satisfies it)."""

from __future__ import annotations

import attrs
import pytest
from pyrsistent import pmap, pset, pvector

from statemachine import (
    DeviceSpec,
    InvariantViolation,
    ModelSpec,
    PeerSpec,
    Policy,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    ShutdownRequested,
    State,
    UnloadRequested,
    check,
    initial_state,
    step,
)
from statemachine.fifo import Fifo
from statemachine.lanes import TargetQueue
from statemachine.state import ReplicaIndex

SETTINGS = Settings(
    models=[ModelSpec("a", slots=2, need={0: 40}), ModelSpec("b", need={0: 60})],
    devices=[DeviceSpec(0, 100)],
    policy=Policy(max_models_per_gpu=2),
)


def base() -> State:
    """Replica 1 of a is ready with requests 1 and 2 in flight; request 3 waits for a free slot."""
    state = initial_state(SETTINGS)
    for event in (RequestArrived(1, "a"), ReplicaReady(1), RequestArrived(2, "a"), RequestArrived(3, "a")):
        state, _ = step(state, event)
    check(state)
    (replica,) = state.replicas
    assert replica.inflight == {1, 2} and state.waiting == 1
    return state


def with_replica(state: State, **changes: object) -> State:
    (replica,) = state.replicas
    return attrs.evolve(state, replicas=(attrs.evolve(replica, **changes),))


def fails(state: State, inv: str, words: str) -> None:
    with pytest.raises(InvariantViolation) as caught:
        check(state)
    assert str(caught.value).startswith(f"{inv}: ") and words in str(caught.value), str(caught.value)


def test_cap_and_budget() -> None:
    state = base()
    (a,) = state.replicas
    b = attrs.evolve(a, id=2, model="b", inflight=pset())
    both = attrs.evolve(state, replicas=(a, b))
    check(both)  # 40 + 60 = 100 fits exactly; two models under a cap of two
    fails(
        attrs.evolve(both, settings=attrs.evolve(SETTINGS, policy=Policy(max_models_per_gpu=1))),
        "INV-CAP",
        "cap 1",
    )
    over = attrs.evolve(SETTINGS, devices=[DeviceSpec(0, 99)])
    fails(attrs.evolve(both, settings=over), "INV-BUDGET", "uses 100 bytes of 99")


def test_replica_ids_slots_phase_and_gpus() -> None:
    state = base()
    (a,) = state.replicas
    fails(attrs.evolve(state, replicas=(a, a)), "INV-IDS", "share an id")
    fails(with_replica(state, inflight=a.inflight.add(3)), "INV-SLOTS", "3 in flight, 2 slots")
    fails(with_replica(state, phase="loading"), "INV-READY", "is loading with requests in flight")
    fails(with_replica(state, phase="stopping"), "INV-KILL-IDLE", "killed with requests in flight")
    check(with_replica(state, phase="stopping", forced=True))
    fails(with_replica(state, gpus=(1,)), "INV-GPUS", "runs on (1,): no GPU set of")


def test_a_failing_model_keeps_a_replica_that_neither_stops_nor_drains() -> None:
    # checks: INV-FAILING
    state = attrs.evolve(base(), failing=pset({"a"}))
    check(state)  # replica 1 of a is ready and takes work: a may stay failing
    gone = "a is marked failing but has no live replica"
    fails(with_replica(state, draining=True), "INV-FAILING", gone)  # draining (unload, reload, broken)
    fails(with_replica(state, phase="stopping", forced=True), "INV-FAILING", gone)  # killed
    fails(with_replica(state, phase="stopping", forced=True, draining=True), "INV-FAILING", gone)
    (a,) = state.replicas
    b = attrs.evolve(a, id=2, model="b", inflight=pset())
    fails(attrs.evolve(state, replicas=(attrs.evolve(a, draining=True), b)), "INV-FAILING", gone)  # b's


def test_replica_memory_is_bounded_and_holds_no_redundant_chain() -> None:
    # checks: INV-AFFINITY-MEMORY
    state = base()  # model a has 2 slots: 8 chains at the default 4 per slot
    check(with_replica(state, memory=tuple((n,) for n in range(8))))
    fails(
        with_replica(state, memory=tuple((n,) for n in range(9))), "INV-AFFINITY-MEMORY", "9 chains (bound 8)"
    )
    fails(with_replica(state, memory=((1,), ())), "INV-AFFINITY-MEMORY", "an empty chain")
    fails(with_replica(state, memory=((1, 2), (1,))), "INV-AFFINITY-MEMORY", "beside its extension (1, 2)")
    check(with_replica(state, memory=((1,), (1, 2))))  # an older, longer chain may stay
    forgetful = attrs.evolve(SETTINGS, policy=Policy(max_models_per_gpu=2, affinity_memory=0))
    check(attrs.evolve(state, settings=forgetful))
    fails(
        attrs.evolve(with_replica(state, memory=((1,),)), settings=forgetful),
        "INV-AFFINITY-MEMORY",
        "1 chains (bound 0)",
    )


def test_every_request_has_one_home() -> None:
    state = base()
    (a,) = state.replicas
    fails(with_replica(state, inflight=a.inflight.remove(2).add(9)), "INV-REQUEST-HOME", "holds request 9")
    moved = attrs.evolve(state.requests[1], replica=7)
    fails(attrs.evolve(state, requests=state.requests.set(1, moved)), "INV-REQUEST-HOME", "holds request 1")
    named = attrs.evolve(state.requests[3], replica=1)
    fails(attrs.evolve(state, requests=state.requests.set(3, named)), "INV-REQUEST-HOME", "queued request 3")
    orphan = with_replica(state, inflight=a.inflight.remove(2))
    fails(orphan, "INV-REQUEST-HOME", "request 2 is inflight but no replica holds it")


def test_queues_agree_with_the_requests() -> None:
    state = base()
    fails(attrs.evolve(state, waiting=2), "INV-QUEUE", "count says 2")
    queue = state.queues["a"]
    lane = (1, "")
    fifo = queue.lanes[lane]

    def with_lane(target: str, lane: tuple[int, str], fifo: Fifo, count: int = 1) -> State:
        return attrs.evolve(state, queues=state.queues.set(target, TargetQueue(pmap({lane: fifo}), count)))

    fails(with_lane("a", lane, attrs.evolve(fifo, count=2)), "INV-QUEUE", "counts 2 but holds 1")
    fails(with_lane("a", lane, fifo, count=2), "INV-QUEUE", "counts 2 but its lanes hold 1")
    dead_head = Fifo(pvector([1, 3]), 0, 1)  # request 1 runs: it is not live, yet it is the head
    fails(with_lane("a", lane, dead_head), "INV-QUEUE", "dead head")
    fails(with_lane("a", (2, ""), fifo), "INV-QUEUE", "sits in the queue of a, lane (2, '')")
    fails(with_lane("a", (1, "alice"), fifo), "INV-QUEUE", "sits in the queue of a, lane (1, 'alice')")
    elsewhere = attrs.evolve(state, queues=pmap({"b": queue}))
    fails(elsewhere, "INV-QUEUE", "sits in the queue of b")
    fails(attrs.evolve(state, queues=pmap()), "INV-QUEUE", "1 requests are queued but 0 are in queues")
    empty = attrs.evolve(state, queues=state.queues.set("b", TargetQueue(pmap({lane: Fifo()}), 0)))
    fails(empty, "INV-QUEUE", "counts 0 but holds 0")


def test_requests_waiting_per_key_are_counted_exactly() -> None:
    state = base()
    assert state.queued_by_key == {"": 1}  # request 3, anonymous
    fails(attrs.evolve(state, queued_by_key=pmap({"": 2})), "INV-KEY-QUEUE", "the counts say {'': 2}")
    fails(attrs.evolve(state, queued_by_key=pmap()), "INV-KEY-QUEUE", "are {'': 1}, the counts say {}")
    request = attrs.evolve(state.requests[3], key="alice")
    keyed = attrs.evolve(state, requests=state.requests.set(3, request))
    fails(keyed, "INV-KEY-QUEUE", "are {'alice': 1}, the counts say {'': 1}")


def test_queue_order_and_shutdown() -> None:
    state = initial_state(SETTINGS)
    for event in (RequestArrived(1, "b"), RequestArrived(2, "b"), RequestArrived(3, "b")):
        state, _ = step(state, event)
    check(state)
    swapped = TargetQueue(pmap({(1, ""): Fifo(pvector([3, 2]), 0, 2)}), 2)  # keep the test about order only
    only_two = state.requests.remove(1)
    fails(
        attrs.evolve(
            state,
            requests=only_two,
            waiting=2,
            queued_by_key=pmap({"": 2}),
            queues=state.queues.set("b", swapped),
        ),
        "INV-QUEUE",
        "out of arrival order",
    )
    fails(attrs.evolve(state, shutting_down=True), "INV-SHUTDOWN", "3 requests still wait")


def test_retired_replicas_take_no_work() -> None:
    state = base()
    kept = attrs.evolve(state, retired=pmap({1: SETTINGS.models["a"]}))
    fails(kept, "INV-RETIRED", "retired replica 1")
    check(with_replica(kept, draining=True))
    fails(attrs.evolve(state, retired=pmap({5: SETTINGS.models["a"]})), "INV-RETIRED", "retired replica 5")
    drained, _ = step(state, UnloadRequested("a"))
    check(drained)
    stopping, _ = step(base(), ShutdownRequested(0.0))
    check(stopping)


def test_requests_forwarded_to_peers_are_counted_there_and_within_limits() -> None:
    # checks: INV-PEER-HOME, INV-PEER-LIMIT, INV-HOP, INV-PEER-DOWN
    settings = Settings(
        models=[ModelSpec("far", gpus=(), peer="box")], peers=[PeerSpec("box", max_in_flight=2)]
    )
    state = initial_state(settings)
    for event in (RequestArrived(1, "far"), RequestArrived(2, "far")):
        state, _ = step(state, event)
    check(state)  # both forwarded to box, at its limit of two
    assert state.peer_inflight == {"box": {1, 2}}
    one = state.requests[1]
    uncounted = attrs.evolve(state, peer_inflight=pmap({"box": pset({2})}))
    fails(uncounted, "INV-PEER-HOME", "request 1 is forwarded to box, not counted")
    with_replica = attrs.evolve(state, requests=state.requests.set(1, attrs.evolve(one, replica=7)))
    fails(with_replica, "INV-PEER-HOME", "request 1 is forwarded to box, not counted")
    empty = attrs.evolve(state, peer_inflight=state.peer_inflight.set("cloud", pset()))
    fails(empty, "INV-PEER-HOME", "peer cloud is listed with no request in flight")
    stray = attrs.evolve(state, peer_inflight=pmap({"box": pset({1, 2, 9})}))
    fails(stray, "INV-PEER-HOME", "peer box counts request 9, which is not forwarded to it")
    hop = attrs.evolve(state, requests=state.requests.set(1, attrs.evolve(one, local_only=True)))
    fails(hop, "INV-HOP", "request 1 came from another router and was forwarded to box")
    tighter = attrs.evolve(settings, peers=[PeerSpec("box", max_in_flight=1)])
    fails(
        attrs.evolve(state, settings=tighter),
        "INV-PEER-LIMIT",
        "peer box has 2 requests in flight (max_in_flight 1)",
    )
    check(attrs.evolve(state, peers_down=pmap({"box": "connection refused"})))
    nowhere = attrs.evolve(state, peers_down=pmap({"nowhere": "connection refused"}))
    fails(nowhere, "INV-PEER-DOWN", "peer nowhere is marked down but not configured")


def test_the_step_cache_must_match_the_replicas() -> None:
    state = base()
    index = state.index
    assert index is not None and index.valid_for(state)
    bad_models = attrs.evolve(index, by_model={"a": (1, 2)})
    fails(attrs.evolve(state, index=bad_models), "INV-INDEX", "replicas by model")
    bad_memo = ReplicaIndex(state.replicas, state.settings, dict(index.by_model), {"a": (True, 1)})
    fails(attrs.evolve(state, index=bad_memo), "INV-INDEX", "model a cached as (True, 1), is (False, 1)")
    check(attrs.evolve(state, index=ReplicaIndex(state.replicas, state.settings, dict(index.by_model), {})))


def test_a_state_without_its_step_cache_steps_the_same() -> None:
    """The cache ``step()`` carries is an optimisation: a state that lost it (built elsewhere, or restored)
    gives the same commands and the same next state."""
    state = base()
    bare = attrs.evolve(state, index=None)
    for event in (RequestFinished(1), ReplicaExited(1, "crashed"), RequestArrived(4, "b")):
        with_cache, commands = step(state, event)
        without, bare_commands = step(bare, event)
        assert bare_commands == commands and without == with_cache


def test_overtakes_are_counted_only_for_waiting_requests_within_the_batch_bound() -> None:
    """checks: INV-SWAP-BATCH"""
    state = base()  # request 3 waits, 1 and 2 are in flight
    bounded = attrs.evolve(state, settings=attrs.evolve(SETTINGS, policy=Policy(swap_batch_max=2)))
    check(attrs.evolve(bounded, overtaken=pmap({3: 1})))
    check(attrs.evolve(bounded, overtaken=pmap({3: 2})))  # the bound itself
    fails(attrs.evolve(bounded, overtaken=pmap({3: 3})), "INV-SWAP-BATCH", "request 3 counts 3 overtakes")
    fails(attrs.evolve(bounded, overtaken=pmap({3: 0})), "INV-SWAP-BATCH", "request 3 counts 0")
    fails(attrs.evolve(bounded, overtaken=pmap({1: 1})), "INV-SWAP-BATCH", "request 1 counts 1")
    fails(attrs.evolve(bounded, overtaken=pmap({9: 1})), "INV-SWAP-BATCH", "request 9 counts 1")
    fails(attrs.evolve(state, overtaken=pmap({3: 1})), "INV-SWAP-BATCH", "(swap_batch_max None)")
