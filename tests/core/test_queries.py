"""The read-side queries the shell and its pages ask of a state (statemachine/queries.py), on states the
scheduler itself produced."""

from __future__ import annotations

import attrs
from pyrsistent import pmap

from statemachine import (
    DeviceSpec,
    ModelSpec,
    ModelState,
    PeerSpec,
    Policy,
    PoolSpec,
    ReplicaReady,
    RequestArrived,
    Settings,
    State,
    initial_state,
    loading_for,
    model_state,
    queue_position,
    ready_replicas,
    replica_state,
    serving_models,
    step,
)
from statemachine.queries import find_replica, queued, replicas_of, residents, used

SETTINGS = Settings(
    models=[ModelSpec("a", slots=1), ModelSpec("b", slots=1), ModelSpec("c", slots=1)],
    pools=[PoolSpec("both", ("a", "b"), fallback=True), PoolSpec("first", ("b", "a"))],
    policy=Policy(max_models_per_gpu=3),
)


def feed(*events: object) -> State:
    state = initial_state(SETTINGS)
    for event in events:
        state, _ = step(state, event)  # type: ignore[arg-type]
    return state


def test_the_models_that_serve_a_target() -> None:
    assert serving_models(SETTINGS, "a") == ("a",)
    assert serving_models(SETTINGS, "both") == ("a", "b")  # fallback: every member, in priority order
    assert serving_models(SETTINGS, "first") == ("b",)  # without fallback only the first member serves


def test_model_state_follows_the_most_advanced_replica() -> None:
    state = feed(RequestArrived(1, "a"))
    assert model_state(state, "a") is ModelState.LOADING
    assert model_state(state, "b") is ModelState.UNLOADED
    state = feed(RequestArrived(1, "a"), ReplicaReady(1))
    assert model_state(state, "a") is ModelState.READY
    stopping = attrs.evolve(state, replicas=tuple(attrs.evolve(r, phase="stopping") for r in state.replicas))
    assert model_state(stopping, "a") is ModelState.STOPPING


def test_ready_replicas_come_in_the_order_of_the_models_asked() -> None:
    state = feed(RequestArrived(1, "a"), RequestArrived(2, "b"), ReplicaReady(1), ReplicaReady(2))
    assert [r.model for r in ready_replicas(state, ("b", "a"))] == ["b", "a"]
    assert [r.model for r in ready_replicas(state, ["c"])] == []


def test_a_draining_ready_replica_shows_as_draining() -> None:
    state = feed(RequestArrived(1, "a"), ReplicaReady(1))
    (replica,) = state.replicas
    assert replica_state(replica) == "ready"
    assert replica_state(attrs.evolve(replica, draining=True)) == "draining"
    assert replica_state(attrs.evolve(replica, phase="stopping", draining=True)) == "stopping"


def test_queue_position_and_the_loads_a_waiting_request_waits_for() -> None:
    # Request 1 runs on a's only slot; 2 and 3 wait; 4 waits for the pool, whose member b loads.
    state = feed(
        RequestArrived(1, "a"),
        ReplicaReady(1),
        RequestArrived(2, "a"),
        RequestArrived(3, "a"),
        RequestArrived(4, "both"),
    )
    assert queue_position(state, 1) is None  # in flight
    assert queue_position(state, 2) == 1
    assert queue_position(state, 3) == 2
    assert queue_position(state, 99) is None
    assert loading_for(state, 2) == []  # a is ready; nothing loads for it
    assert [r.model for r in loading_for(state, 4)] == ["b"]
    assert loading_for(state, 1) == []


def test_replicas_residents_memory_and_the_queue_of_a_state() -> None:
    settings = Settings(
        models=[ModelSpec("a", need={0: 30}), ModelSpec("b", need={0: 50, 1: 20}, gpus=(0, 1))],
        devices=[DeviceSpec(0, 100), DeviceSpec(1, 100)],
        policy=Policy(max_models_per_gpu=2),
    )
    state = initial_state(settings)
    for event in (RequestArrived(1, "a"), RequestArrived(2, "b"), RequestArrived(3, "a")):
        state, _ = step(state, event)
    assert [(r.id, r.model) for r in replicas_of(state, "b")] == [(2, "b")]
    found = find_replica(state, 2)
    assert found is not None and found.model == "b" and find_replica(state, 9) is None
    assert residents(state, 0) == {"a", "b"} and residents(state, 1) == {"b"}
    assert used(state, 0) == 80 and used(state, 1) == 20
    assert [r.rid for r in queued(state)] == [1, 2, 3]
    state, _ = step(state, ReplicaReady(1))
    assert [r.rid for r in queued(state)] == [2, 3]  # a has one slot: request 1 took it


def test_only_a_waiting_request_waits_for_loads() -> None:
    settings = Settings(models=[ModelSpec("a", replicas=2)])
    state = initial_state(settings)
    for event in (RequestArrived(1, "a"), ReplicaReady(1), RequestArrived(2, "a")):
        state, _ = step(state, event)
    assert [r.phase for r in state.replicas] == ["ready", "loading"]
    assert state.requests[1].phase == "inflight"
    assert loading_for(state, 1) == []  # running on replica 1 while replica 2 still loads
    assert [r.id for r in loading_for(state, 2)] == [2]
    assert loading_for(state, 99) == [] and queue_position(state, 99) is None


def test_a_peers_limit_is_its_max_in_flight_and_0_once_it_is_not_configured() -> None:
    """/status and /metrics show it; a model whose peer a reload removed forwards nothing (0)."""
    settings = Settings(
        models=[ModelSpec("far", gpus=(), peer="box")], peers=[PeerSpec("box", max_in_flight=3)]
    )
    assert settings.peer_limit("box") == 3
    assert settings.peer_limit("gone") == 0


def test_settings_take_their_tables_as_lists_or_as_mappings() -> None:
    """A replay pastes them as pmaps, and ``attrs.evolve`` hands the converted tables back in."""
    listed = Settings(
        models=[ModelSpec("a"), ModelSpec("far", gpus=(), peer="box")],
        pools=[PoolSpec("both", ("a", "far"), fallback=True)],
        devices=[DeviceSpec(0, 100)],
        peers=[PeerSpec("box", max_in_flight=3)],
    )
    mapped = Settings(
        models=pmap({"a": ModelSpec("a"), "far": ModelSpec("far", gpus=(), peer="box")}),
        pools=pmap({"both": PoolSpec("both", ("a", "far"), fallback=True)}),
        devices=pmap({0: DeviceSpec(0, 100)}),
        peers=pmap({"box": PeerSpec("box", max_in_flight=3)}),
    )
    assert mapped == listed
    evolved = attrs.evolve(listed, policy=Policy(max_models_per_gpu=2))
    assert (evolved.models, evolved.pools, evolved.devices, evolved.peers) == (
        listed.models,
        listed.pools,
        listed.devices,
        listed.peers,
    )
