"""Scheduler scenarios: prefix affinity decides which free replica of a model a request goes to.

Model ``a`` has two replicas loaded at startup; chains are written out by hand (one element per block). Each
scenario lists the exact commands every step must answer with.
"""

from __future__ import annotations

from statemachine import (
    Dispatch,
    ModelSpec,
    Policy,
    PoolSpec,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
)
from statemachine.affinity import remember, shared
from tests.support.scenario import Script, play

A1, A2, A3 = (10,), (10, 11), (10, 11, 12)
B1, B2, B3 = (20,), (20, 21), (20, 21, 22)


def two_replicas(slots: int = 2, **policy: object) -> Settings:
    spec = ModelSpec("a", replicas=2, slots=slots, load_on_startup=True)
    return Settings(models=[spec], policy=Policy(**policy))  # type: ignore[arg-type]


def started() -> Script:
    return [
        (
            Startup(),
            [Spawn(1, "a", (0,), "load on startup", None), Spawn(2, "a", (0,), "load on startup", None)],
        ),
        (ReplicaReady(1), []),
        (ReplicaReady(2), []),
    ]


def two_conversations() -> Script:
    """Conversation A lands on replica 1, B (while A is in flight) on replica 2; both finish."""
    return [
        *started(),
        (RequestArrived(1, "a", prefix=A1), [Dispatch(1, 1, "a")]),
        (RequestArrived(2, "a", prefix=B1), [Dispatch(2, 2, "a")]),  # nothing matches: least busy
        (RequestFinished(1), []),
        (RequestFinished(2), []),
    ]


def test_a_conversation_returns_to_the_replica_that_served_its_prefix() -> None:
    # checks: INV-AFFINITY-LONGEST
    state = play(
        two_replicas(),
        [
            *two_conversations(),
            (RequestArrived(3, "a", prefix=B2), [Dispatch(3, 2, "a")]),  # least busy would pick replica 1
            (RequestArrived(4, "a", prefix=A2), [Dispatch(4, 1, "a")]),
            (RequestArrived(5, "a", prefix=B3), [Dispatch(5, 2, "a")]),  # 1 in flight each: B matches 2
        ],
    )
    memory = {r.id: r.memory for r in state.replicas}
    assert memory == {1: (A2,), 2: (B3,)}  # each chain replaced the shorter one it extends


def test_empty_and_unmatched_chains_pick_the_least_busy_replica() -> None:
    # checks: INV-AFFINITY-NEUTRAL
    play(
        two_replicas(),
        [
            *two_conversations(),
            (RequestArrived(3, "a"), [Dispatch(3, 1, "a")]),  # no chain: lowest id of the idle ones
            (RequestArrived(4, "a", prefix=(30, 31)), [Dispatch(4, 2, "a")]),  # no match: fewest in flight
            (RequestArrived(5, "a", prefix=(40,)), [Dispatch(5, 1, "a")]),  # tie on load: lowest id
        ],
    )


def test_equal_matches_go_to_the_least_busy_of_them() -> None:
    # checks: INV-AFFINITY-LONGEST INV-AFFINITY-GUARD
    play(
        two_replicas(slots=3),
        [
            *started(),
            (RequestArrived(1, "a", prefix=A2), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a", prefix=A2), [Dispatch(2, 1, "a")]),  # match, 1 in flight ≤ 0 + 1
            (RequestArrived(3, "a", prefix=A2), [Dispatch(3, 2, "a")]),  # replica 1 is 2 ahead: too busy
            (RequestFinished(2), []),
            (RequestFinished(3), []),  # both remember A2; replica 1 holds 1 request, replica 2 none
            (RequestArrived(4, "a", prefix=A3), [Dispatch(4, 2, "a")]),
        ],
    )


def test_the_guard_bounds_how_much_busier_the_matching_replica_may_be() -> None:
    # checks: INV-AFFINITY-GUARD
    busy_a = [
        *started(),
        (RequestArrived(1, "a", prefix=A1), [Dispatch(1, 1, "a")]),
        (RequestArrived(2, "a", prefix=B1), [Dispatch(2, 2, "a")]),
        (RequestFinished(2), []),  # replica 1 holds 1 request, replica 2 none
    ]
    play(two_replicas(slots=3), [*busy_a, (RequestArrived(3, "a", prefix=A2), [Dispatch(3, 1, "a")])])
    play(
        two_replicas(slots=3, affinity_guard=0),
        [*busy_a, (RequestArrived(3, "a", prefix=A2), [Dispatch(3, 2, "a")])],  # only the idle compete
    )
    play(
        two_replicas(slots=3),
        [
            *busy_a,
            (RequestArrived(3, "a", prefix=A2), [Dispatch(3, 1, "a")]),
            (RequestArrived(4, "a", prefix=A3), [Dispatch(4, 2, "a")]),  # replica 1 is 2 ahead: too busy
        ],
    )


def test_a_full_replica_is_never_chosen_for_its_match() -> None:
    # checks: INV-AFFINITY-GUARD
    play(
        two_replicas(slots=1, affinity_guard=5),
        [
            *started(),
            (RequestArrived(1, "a", prefix=A1), [Dispatch(1, 1, "a")]),
            (RequestArrived(2, "a", prefix=A2), [Dispatch(2, 2, "a")]),
            (RequestArrived(3, "a", prefix=A3), []),  # both full: it waits
            (RequestFinished(2), [Dispatch(3, 2, "a")]),
        ],
    )


def test_pool_members_choose_their_replica_by_affinity() -> None:
    # checks: INV-AFFINITY-LONGEST
    settings = Settings(
        models=[ModelSpec("small", gpus=(1,), load_on_startup=True), two_replicas(slots=1).models["a"]],
        pools=[PoolSpec("p", ("small", "a"), fallback=True)],
    )
    play(
        settings,
        [
            (
                Startup(),
                [
                    Spawn(1, "a", (0,), "load on startup", None),
                    Spawn(2, "a", (0,), "load on startup", None),
                    Spawn(3, "small", (1,), "load on startup", None),
                ],
            ),
            (ReplicaReady(1), []),
            (ReplicaReady(2), []),
            (ReplicaReady(3), []),
            (RequestArrived(1, "p", prefix=A1), [Dispatch(1, 3, "small")]),  # the first member first
            (RequestArrived(2, "p", prefix=B1), [Dispatch(2, 1, "a")]),
            (RequestArrived(3, "p", prefix=A1), [Dispatch(3, 2, "a")]),
            (RequestFinished(2), []),
            (RequestFinished(3), []),
            (RequestArrived(4, "p", prefix=B2), [Dispatch(4, 1, "a")]),
            (RequestFinished(4), []),
            (RequestArrived(5, "p", prefix=A2), [Dispatch(5, 2, "a")]),  # small is busy; a's replica 2 has A
        ],
    )


def test_memory_is_bounded_per_slot() -> None:
    # checks: INV-AFFINITY-MEMORY
    chains = [(n, n + 1) for n in range(0, 100, 10)]
    script = [*started()]
    for rid, chain in enumerate(chains, start=1):
        script += [
            (RequestArrived(rid, "a", prefix=chain), [Dispatch(rid, 1, "a")]),
            (RequestFinished(rid), []),
        ]
    # every chain after the first matches nothing, so all go to replica 1 (lowest id)
    state = play(two_replicas(slots=1, affinity_memory=3), script)
    memory = {r.id: r.memory for r in state.replicas}
    assert memory == {1: ((90, 91), (80, 81), (70, 71)), 2: ()}
    off = play(two_replicas(slots=1, affinity_memory=0), script)
    assert all(r.memory == () for r in off.replicas)


def test_shared_counts_leading_elements_and_remember_drops_what_a_chain_extends() -> None:
    # checks: INV-AFFINITY-MEMORY
    assert shared((), A3) == 0
    assert shared((A1, B3), A3) == 1
    assert shared(((10, 11, 99),), A3) == 2
    assert shared((A3,), A1) == 1
    assert shared((A3, (10, 11, 12, 13)), A3) == 3
    assert remember((A1, B1), A2, 4) == (A2, B1)
    assert remember((A3, B1), A2, 4) == (A2, A3, B1)  # a longer chain is not dropped by its prefix
    assert remember((A2, B1), A2, 4) == (A2, B1)
    assert remember((A1, B1), (), 4) == (A1, B1)
    assert remember((A1, B1), (30,), 2) == ((30,), A1)
