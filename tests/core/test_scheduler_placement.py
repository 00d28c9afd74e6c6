"""Scheduler scenarios: models with ``gpus = "any"`` (``ModelSpec.choices``), placed by the scheduler at each
load (spec §4d), and memory other processes hold (``ForeignMemory``).

Cards of 24, 12 and 8 GiB (GPUs 0, 1, 2) unless said otherwise; a model of 7 GiB fits any of them alone.
"""

from __future__ import annotations

import pytest

from statemachine import (
    DeviceSpec,
    Dispatch,
    ForeignMemory,
    IllegalEvent,
    Kill,
    KillCause,
    LoadRequested,
    ModelSpec,
    Placement,
    Policy,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    SettingsChanged,
    Spawn,
    Startup,
    Tick,
    UnloadRequested,
    initial_state,
    step,
)
from statemachine.invariants import check
from statemachine.queries import used
from tests.support.scenario import evict, play, spawn

GIB = 1 << 30
CARDS = (24, 12, 8)


def sets(cards: tuple[int, ...] = CARDS, size: int = 1) -> list[tuple[int, ...]]:
    """Every set of ``size`` GPU ids among ``cards``."""
    ids = range(len(cards))
    if size == 1:
        return [(g,) for g in ids]
    return [(a, b) for a in ids for b in ids if a < b]


def anywhere(name: str, gib: float, cards: tuple[int, ...] = CARDS, **kwargs: object) -> ModelSpec:
    """A model of ``gib`` GiB that may run on one card, or split evenly over two."""
    whole = int(gib * GIB)
    choices = [Placement(s, {s[0]: whole}) for s in sets(cards)]
    choices += [Placement(s, {g: whole // 2 + GIB // 2 for g in s}) for s in sets(cards, 2)]
    return ModelSpec.anywhere(name, choices, **kwargs)


def cards(*models: ModelSpec, sizes: tuple[int, ...] = CARDS, **policy: object) -> Settings:
    devices = [DeviceSpec(i, size * GIB) for i, size in enumerate(sizes)]
    return Settings(models=list(models), devices=devices, policy=Policy(**policy))  # type: ignore[arg-type]


def test_each_model_goes_to_the_card_with_the_most_free_memory() -> None:
    """One model per card (the default cap): 24 GiB first, then 12, then 8; a fourth model swaps."""
    settings = cards(anywhere("a", 7), anywhere("b", 7), anywhere("c", 7), anywhere("d", 7))
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1, gpus=(0,))]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
            (RequestArrived(3, "c"), [spawn(3, "c", 3, gpus=(2,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (ReplicaReady(3), [Dispatch(3, 3, "c")]),
            (RequestFinished(1), []),
            (RequestFinished(3), []),
            (Tick(1.0), []),
            (RequestFinished(2), []),
            # Every card holds one idle model: d evicts the one idle longest whose card has the most memory.
            (RequestArrived(4, "d"), [evict(1, "a", "d", gpus=(0,))]),
            (ReplicaExited(1, "evicted"), [spawn(4, "d", 4, gpus=(0,))]),
        ],
    )


def test_a_card_with_room_is_used_before_anything_is_evicted() -> None:
    # checks: INV-PLACE-ROOM
    """Two models per card: b joins a on the big card rather than evict; a third 12 GiB model goes where
    it fits (the 12 GiB card), not where it would need a swap."""
    settings = cards(anywhere("a", 7), anywhere("b", 7), anywhere("c", 11), max_models_per_gpu=2)
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1, gpus=(0,))]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(0,))]),
            (RequestArrived(3, "c"), [spawn(3, "c", 3, gpus=(1,))]),
        ],
    )


def test_a_model_too_big_for_any_card_is_split_over_the_fewest() -> None:
    # checks: INV-PLACE-SMALLEST
    """20 GiB on two 12 GiB cards: split, since no single card holds it."""
    big = ModelSpec.anywhere("big", [Placement((0, 1), {0: 10 * GIB, 1: 10 * GIB})])
    settings = cards(big, sizes=(12, 12))
    play(settings, [(RequestArrived(1, "big"), [spawn(1, "big", 1, gpus=(0, 1))])])


def test_one_card_is_preferred_to_a_split_even_when_it_needs_a_swap() -> None:
    # checks: INV-PLACE-SMALLEST
    """b fits either 12 GiB card alone but a holds one and the other holds c: one card, by a swap (of the
    model idle longest), rather than a split over both."""
    settings = cards(
        anywhere("a", 7, (12, 12)), anywhere("b", 7, (12, 12)), anywhere("c", 7, (12, 12)), sizes=(12, 12)
    )
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1, gpus=(0,))]),
            (RequestArrived(2, "c"), [spawn(2, "c", 2, gpus=(1,))]),
            (ReplicaReady(2), [Dispatch(2, 2, "c")]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(2), []),
            (Tick(1.0), []),
            (RequestFinished(1), []),
            (RequestArrived(3, "b"), [evict(2, "c", "b", gpus=(1,))]),
        ],
    )


def test_a_busy_card_is_left_alone_when_an_idle_one_can_be_swapped() -> None:
    """a is busy on the 24 GiB card, c idle on the 8: b evicts c, though a was used less recently."""
    two = (24, 8)
    settings = cards(anywhere("a", 7, two), anywhere("b", 7, two), anywhere("c", 7, two), sizes=two)
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1, gpus=(0,))]),
            (RequestArrived(2, "c"), [spawn(2, "c", 2, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "c")]),
            (Tick(1.0), []),
            (RequestFinished(2), []),
            (RequestArrived(3, "b"), [evict(2, "c", "b", gpus=(1,))]),
        ],
    )


def test_replicas_spread_over_cards() -> None:
    # checks: INV-PLACE-SPREAD
    """Three replicas of one model: one per card, all started by the first request."""
    settings = cards(anywhere("a", 7, replicas=3, slots=1))
    play(
        settings,
        [
            (
                RequestArrived(1, "a"),
                [spawn(1, "a", 1, gpus=(0,)), spawn(2, "a", 1, gpus=(1,)), spawn(3, "a", 1, gpus=(2,))],
            ),
        ],
    )


def test_without_spread_replicas_go_where_the_most_memory_is_free() -> None:
    """24 GiB free, then 17 (beside the first replica), then 10 against the 12 GiB card's 12."""
    settings = cards(anywhere("a", 7, replicas=3, slots=1, spread=False), max_models_per_gpu=2)
    play(
        settings,
        [
            (
                RequestArrived(1, "a"),
                [spawn(1, "a", 1, gpus=(0,)), spawn(2, "a", 1, gpus=(0,)), spawn(3, "a", 1, gpus=(1,))],
            ),
        ],
    )


def test_startup_places_pinned_models_on_different_cards() -> None:
    settings = cards(anywhere("a", 7, pinned=True), anywhere("b", 7, pinned=True))
    play(
        settings,
        [
            (
                Startup(),
                [
                    Spawn(1, "a", (0,), "load on startup", None),
                    Spawn(2, "b", (1,), "load on startup", None),
                ],
            ),
        ],
    )


def test_other_processes_memory_sends_the_next_load_to_another_card() -> None:
    # checks: INV-PLACE-BUDGET
    """20 GiB of the big card taken by another process: a goes to the 12 GiB card, with nothing failed."""
    settings = cards(anywhere("a", 7))
    play(
        settings,
        [
            (ForeignMemory(0, 20 * GIB), []),
            (RequestArrived(1, "a"), [spawn(1, "a", 1, gpus=(1,))]),
        ],
    )


def test_a_fixed_model_waits_for_foreign_memory_to_leave_and_residents_stay() -> None:
    # checks: INV-FOREIGN
    """b is bound to GPU 0: while another process holds so much of the card that even without a there would
    be no room, b waits and the idle resident a is not stopped; once the memory is back, b loads beside a."""
    a = ModelSpec("a", gpus=(0,), need={0: 7 * GIB})
    b = ModelSpec("b", gpus=(0,), need={0: 7 * GIB})
    settings = cards(a, b, sizes=(24,), max_models_per_gpu=2)
    state = play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ForeignMemory(0, 18 * GIB), []),
            (RequestArrived(2, "b"), []),
            (RequestFinished(1), []),
            (Tick(100.0), []),
            (ForeignMemory(0, 10 * GIB), [spawn(2, "b", 2)]),
        ],
    )
    assert used(state, 0) == 14 * GIB


def test_foreign_memory_is_checked_and_forgotten_at_zero() -> None:
    state = initial_state(cards(anywhere("a", 7)))
    state, _ = step(state, ForeignMemory(1, GIB))
    assert dict(state.foreign) == {1: GIB}
    state, _ = step(state, ForeignMemory(1, 0))
    assert dict(state.foreign) == {}
    check(state)
    # A reload plans its budgets with what other processes hold then: the figures start again from 0.
    state, _ = step(state, ForeignMemory(2, GIB))
    state, _ = step(state, SettingsChanged(state.settings))
    assert dict(state.foreign) == {}
    with pytest.raises(IllegalEvent):
        step(state, ForeignMemory(0, -1))


def test_the_choice_depends_on_the_state_alone() -> None:
    # checks: INV-PLACE-ORDERLESS
    """The same events give the same placements, whatever order the choices were listed in."""
    forward = anywhere("a", 7)
    backward = ModelSpec.anywhere("a", list(reversed(forward.choices)))
    for spec in (forward, backward):
        _, commands = step(initial_state(cards(spec)), RequestArrived(1, "a"))
        assert commands == (spawn(1, "a", 1, gpus=(0,)),)


def test_a_second_replica_is_split_when_its_own_card_is_full() -> None:
    """Two replicas of a 14 GiB model: only the 24 GiB card holds one alone, and it holds the first; the
    second goes to the fewest cards that hold it beside that one, split over the 12 and the 8."""
    # checks: INV-PLACE-SMALLEST
    choices = [
        Placement((0,), {0: 14 * GIB}),
        Placement((1,), {1: 14 * GIB}),  # more than the card: never loadable
        Placement((1, 2), {1: 8 * GIB, 2: 8 * GIB}),
        Placement((0, 1), {0: 8 * GIB, 1: 8 * GIB}),
    ]
    big = ModelSpec.anywhere("big", choices, replicas=2, slots=1)
    play(
        cards(big),
        [(RequestArrived(1, "big"), [spawn(1, "big", 1, gpus=(0,)), spawn(2, "big", 1, gpus=(1, 2))])],
    )


def test_equal_room_goes_to_the_card_with_fewer_residents() -> None:
    """The 24 GiB card holds a (12 GiB), the 12 GiB card nothing: 12 GiB free on each, b goes to the empty
    one."""
    a = ModelSpec("a", gpus=(0,), need={0: 12 * GIB})
    settings = cards(a, anywhere("b", 6, (24, 12)), sizes=(24, 12), max_models_per_gpu=2)
    play(
        settings,
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2, gpus=(1,))]),
        ],
    )


@pytest.mark.parametrize("short", ["a model per card", "memory"])
def test_further_replicas_start_only_where_they_fit_now(short: str) -> None:
    """a's first replica takes the empty big card; a second one fits no card alone beside it, and the pair
    it could split over holds b (with one model per card, or b's 8 GiB leave no room there): it does not
    start, and b is not evicted for it."""
    # checks: INV-PLACE-BUDGET
    choices = [
        Placement((0,), {0: 14 * GIB}),
        Placement((0, 1), {0: 8 * GIB, 1: 8 * GIB}),
    ]
    a = ModelSpec.anywhere("a", choices, replicas=2, slots=1)
    b = ModelSpec("b", gpus=(1,), need={1: (4 if short == "a model per card" else 8) * GIB})
    play(
        cards(a, b, sizes=(24, 12), max_models_per_gpu=1 if short == "a model per card" else 2),
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1, gpus=(1,))]),
            (RequestArrived(2, "a"), [spawn(2, "a", 2, gpus=(0,))]),
        ],
    )


def test_further_replicas_keep_off_a_card_an_earlier_request_claims() -> None:
    """x (interactive) claims the big card and waits for y's work there to drain; m's first replica takes the
    small card, and its second, which only the big card could hold, does not start there."""
    # checks: INV-PLACE-ROOM
    x = ModelSpec("x", gpus=(0,), need={0: 20 * GIB})
    y = ModelSpec("y", gpus=(0,), need={0: 10 * GIB})
    m = ModelSpec.anywhere(
        "m", [Placement((0,), {0: 5 * GIB}), Placement((1,), {1: 5 * GIB})], replicas=2, slots=1
    )
    play(
        cards(x, y, m, sizes=(24, 6), max_models_per_gpu=2),
        [
            (RequestArrived(1, "y"), [spawn(1, "y", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "y")]),
            (RequestArrived(2, "x", klass=RequestClass.INTERACTIVE), []),
            (RequestArrived(3, "m"), [spawn(2, "m", 3, gpus=(1,))]),
        ],
    )


def test_the_swap_takes_the_card_whose_victims_were_used_longest_ago() -> None:
    """Two cards of two residents each; n needs a whole card. Card 0's residents were used at 1 and 4, card
    1's at 2 and 3: card 1's are the staler pair (its latest use is older), so both of them go."""
    # checks: INV-PLACE-ROOM
    fixed = [ModelSpec(m, gpus=(g,), need={g: 10 * GIB}) for m, g in (("p", 0), ("q", 0), ("r", 1), ("s", 1))]
    n = ModelSpec.anywhere("n", [Placement((0,), {0: 24 * GIB}), Placement((1,), {1: 24 * GIB})])
    settings = cards(*fixed, n, sizes=(24, 24), max_models_per_gpu=3)
    script: list[tuple[object, list[object]]] = []
    for rid, (model, gpu) in enumerate((("p", 0), ("q", 0), ("r", 1), ("s", 1)), 1):
        script += [
            (RequestArrived(rid, model), [spawn(rid, model, rid, gpus=(gpu,))]),
            (ReplicaReady(rid), [Dispatch(rid, rid, model)]),
        ]
    for at, rid in ((1.0, 1), (2.0, 3), (3.0, 4), (4.0, 2)):
        script += [(Tick(at), []), (RequestFinished(rid), [])]
    script.append((RequestArrived(5, "n"), [evict(3, "r", "n", gpus=(1,)), evict(4, "s", "n", gpus=(1,))]))
    play(settings, script)  # type: ignore[arg-type]


def test_a_card_whose_resident_may_leave_now_goes_before_one_that_must_stay() -> None:
    """a was loaded just now and may not leave for min_residency; b has been loaded long enough: n evicts b
    at once rather than wait for a, though a's card has the same room."""
    a = ModelSpec("a", gpus=(0,), need={0: 10 * GIB})
    b = ModelSpec("b", gpus=(1,), need={1: 10 * GIB})
    n = ModelSpec.anywhere("n", [Placement((0,), {0: 10 * GIB}), Placement((1,), {1: 10 * GIB})])
    settings = cards(a, b, n, sizes=(24, 24), min_residency=100.0)
    play(
        settings,
        [
            (RequestArrived(1, "b"), [spawn(1, "b", 1, gpus=(1,))]),
            (ReplicaReady(1), [Dispatch(1, 1, "b")]),
            (RequestFinished(1), []),
            (Tick(200.0), []),
            (RequestArrived(2, "a"), [spawn(2, "a", 2)]),
            (ReplicaReady(2), [Dispatch(2, 2, "a")]),
            (RequestFinished(2), []),
            (RequestArrived(3, "n"), [evict(1, "b", "n", gpus=(1,))]),
        ],
    )


def test_no_resident_is_stopped_for_a_card_other_processes_overfill() -> None:
    """Other processes take 16 GiB of the 24 GiB card that holds a (10 GiB): a and they now exceed its budget.
    b (6 GiB) would fit if a left, but a is not evicted for it: b waits until the memory is back."""
    # checks: INV-FOREIGN
    a = ModelSpec("a", gpus=(0,), need={0: 10 * GIB})
    b = ModelSpec("b", gpus=(0,), need={0: 6 * GIB})
    play(
        cards(a, b, sizes=(24,)),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(1), []),
            (ForeignMemory(0, 16 * GIB), []),
            (Tick(100.0), []),
            (RequestArrived(2, "b"), []),
            (ForeignMemory(0, 0), [evict(1, "a", "b")]),
        ],
    )


@pytest.mark.parametrize("placed", [False, True])
def test_a_resident_of_unknown_need_takes_no_byte(placed: bool) -> None:
    """y (pinned, bound to GPU 0 or placed there) has no predicted need: it counts 0 bytes, not one more nor
    one less. A model that needs the whole 24 GiB loads beside it; one that needs a byte more is refused."""
    # checks: INV-PLACE-BUDGET
    y = ModelSpec.anywhere("y", [Placement((0,), {})], pinned=True) if placed else ModelSpec("y", pinned=True)
    whole = ModelSpec("whole", gpus=(0,), need={0: 24 * GIB})
    over = ModelSpec("over", gpus=(0,), need={0: 24 * GIB + 1})
    refusal = (
        "model 'over' cannot be loaded on GPU 0: its memory need exceeds what the GPU budget leaves beside "
        "pinned models; choose a smaller quant or context"
    )
    play(
        cards(y, whole, over, sizes=(24,), max_models_per_gpu=3),
        [
            (Startup(), [Spawn(1, "y", (0,), "load on startup", None)]),
            (RequestArrived(1, "over"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, refusal)]),
            (RequestArrived(2, "whole"), [spawn(2, "whole", 2)]),
        ],
    )


def test_a_request_never_goes_to_a_replica_on_a_claimed_card_even_by_prefix_affinity() -> None:
    """m has a replica on each card; the one on card 0 served m's last prompt. x (interactive) then claims
    card 0 for a swap. m's next request with the same prompt goes to the replica on card 1: a dispatch to
    card 0 would pass the claim."""
    # checks: INV-PLACE-ROOM
    y = ModelSpec("y", gpus=(0,), need={0: 10 * GIB})
    x = ModelSpec("x", gpus=(0,), need={0: 20 * GIB})
    m = ModelSpec.anywhere(
        "m", [Placement((0,), {0: 5 * GIB}), Placement((1,), {1: 5 * GIB})], replicas=2, slots=2
    )
    play(
        cards(x, y, m, sizes=(32, 24), max_models_per_gpu=3),
        [
            (RequestArrived(1, "y"), [spawn(1, "y", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "y")]),  # y stays busy: the claim below waits for it
            (Tick(1.0), []),
            (RequestArrived(2, "m", prefix=(7,)), [spawn(2, "m", 2, gpus=(1,)), spawn(3, "m", 2, gpus=(0,))]),
            (ReplicaReady(3), [Dispatch(2, 3, "m")]),
            (ReplicaReady(2), []),
            (Tick(2.0), []),
            (RequestFinished(2), []),
            (RequestArrived(3, "x", klass=RequestClass.INTERACTIVE), []),
            (RequestArrived(4, "m", prefix=(7,)), [Dispatch(4, 2, "m")]),
        ],
    )


def test_prefix_affinity_still_chooses_among_the_replicas_off_a_claimed_card() -> None:
    """m has a replica on each of three cards; the one on card 2 served m's last prompt. x claims card 0.
    m's next request with the same prompt goes to card 2 by affinity, not to the lowest idle id (card 1)."""
    # checks: INV-PLACE-ROOM
    y = ModelSpec("y", gpus=(0,), need={0: 10 * GIB})
    x = ModelSpec("x", gpus=(0,), need={0: 20 * GIB})
    m = ModelSpec.anywhere("m", [Placement((g,), {g: 5 * GIB}) for g in range(3)], replicas=3, slots=2)
    three = [spawn(2, "m", 2, gpus=(1,)), spawn(3, "m", 2, gpus=(2,)), spawn(4, "m", 2, gpus=(0,))]
    play(
        cards(x, y, m, sizes=(32, 24, 24), max_models_per_gpu=3),
        [
            (RequestArrived(1, "y"), [spawn(1, "y", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "y")]),
            (Tick(1.0), []),
            (RequestArrived(2, "m", prefix=(7,)), three),
            (ReplicaReady(3), [Dispatch(2, 3, "m")]),
            (ReplicaReady(2), []),
            (ReplicaReady(4), []),
            (Tick(2.0), []),
            (RequestFinished(2), []),
            (RequestArrived(3, "x", klass=RequestClass.INTERACTIVE), []),
            (RequestArrived(4, "m", prefix=(7,)), [Dispatch(4, 3, "m")]),
        ],
    )


def test_a_gpu_nobody_else_uses_has_its_whole_budget_and_not_a_byte_more() -> None:
    """b needs one byte more than a leaves of the card: a is evicted for it (no other process is counted,
    neither as taking memory nor as giving any)."""
    a = ModelSpec("a", gpus=(0,), need={0: 10 * GIB})
    b = ModelSpec("b", gpus=(0,), need={0: 14 * GIB + 1})
    play(
        cards(a, b, sizes=(24,), max_models_per_gpu=2),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (RequestFinished(1), []),
            (RequestArrived(2, "b"), [evict(1, "a", "b")]),
        ],
    )


def test_a_replica_already_stopping_does_not_count_as_staying_beside_other_processes() -> None:
    """a is being stopped; b stays; other processes hold 8 GiB. What stays (b) and they fit the budget, so
    the card is not overfilled: c evicts b as usual."""
    # checks: INV-FOREIGN
    a = ModelSpec("a", gpus=(0,), need={0: 10 * GIB})
    b = ModelSpec("b", gpus=(0,), need={0: 8 * GIB})
    c = ModelSpec("c", gpus=(0,), need={0: 10 * GIB})
    play(
        cards(a, b, c, sizes=(24,), max_models_per_gpu=3),
        [
            (RequestArrived(1, "a"), [spawn(1, "a", 1)]),
            (RequestArrived(2, "b"), [spawn(2, "b", 2)]),
            (ReplicaReady(1), [Dispatch(1, 1, "a")]),
            (ReplicaReady(2), [Dispatch(2, 2, "b")]),
            (RequestFinished(1), []),
            (RequestFinished(2), []),
            (UnloadRequested("a"), [Kill(1, "a", "unload requested", KillCause.UNLOADED)]),
            (ForeignMemory(0, 8 * GIB), []),
            (RequestArrived(3, "c"), [evict(2, "b", "c")]),
        ],
    )


def test_a_model_no_set_can_hold_is_refused_with_its_sets() -> None:
    """Every set of big needs more than its card: its request is refused at once, naming the sets."""
    big = ModelSpec.anywhere(
        "big", [Placement((0,), {0: 30 * GIB}), Placement((0, 1), {0: 20 * GIB, 1: 20 * GIB})]
    )
    refusal = (
        "model 'big' cannot be loaded on any GPU set it may use (0; 0,1): pinned models hold them or its "
        "memory need exceeds what their budgets leave beside pinned models; unpin a model, or choose a "
        "smaller quant or context"
    )
    play(
        cards(big, sizes=(24, 12)),
        [(RequestArrived(1, "big"), [Reject(1, RejectCode.MODEL_UNAVAILABLE, refusal)])],
    )


def test_a_load_asked_for_starts_every_replica_that_fits_spread_over_cards() -> None:
    settings = cards(anywhere("a", 7, replicas=2, slots=1))
    play(
        settings,
        [
            (
                LoadRequested("a"),
                [Spawn(1, "a", (0,), "load requested", None), Spawn(2, "a", (1,), "load requested", None)],
            ),
        ],
    )
