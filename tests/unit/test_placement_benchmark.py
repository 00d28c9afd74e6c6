"""The placement benchmark's goals, on its own simulation (the scheduler with a simulated clock: exact, not
timed): six models of 7 to 9 GiB on four 12 GiB cards, four closed-loop agents switching model now and then.
Placed by the scheduler (``any``), every request is answered, every card is used, and there are fewer swaps
than under every fixed assignment of the models to the cards (all 4^6, one run per relabelling class)."""

from __future__ import annotations

from benchmarks.bench_placement import (
    anywhere,
    assignments,
    compare,
    fixed,
    layout,
    partitions,
    simulate,
    workload,
)

CARDS = [12.0] * 4


def test_fixed_assignments_stand_for_every_raw_one() -> None:
    """187 set partitions of six models into at most four groups, standing for 4^6 raw assignments; mixed
    cards: every raw assignment where each model fits its card (the 9 GiB model not on an 8 GiB card)."""
    assert len(list(partitions(6, 4))) == 187
    identical = assignments(CARDS)
    assert (len(identical), sum(weight for _, weight in identical)) == (187, 4**6)
    mixed = assignments([24.0, 12.0, 8.0, 8.0])
    assert len(mixed) == 4**4 * 2**2  # models of 7 to 8 GiB fit every card; e (8.5) and f (9) only two
    assert all(weight == 1 and a[4] < 2 and a[5] < 2 for a, weight in mixed)


def test_every_request_is_answered_under_every_placement() -> None:
    result = compare(CARDS, seed=1, agents=4, requests=6, load=10.0)
    assert result["any"]["answered"] == result["any"]["requests"] == 24
    assert result["fixed"]["every_answered"]
    assert result["any"]["cards_used"] == [0, 1, 2, 3]


def test_any_swaps_less_than_every_fixed_assignment() -> None:
    """The benchmark's default workload (seed 1, 100 requests per agent). A fixed run stops as soon as it
    has swapped more than ``any``: that is all the goal needs.

    Seed 1 was the default before any run; ``python benchmarks/bench_placement.py --seed 1-8`` shows the goal
    met on each of seeds 1 to 8 (a swap under ``any`` evicts the idle model used least recently, as a swap on
    fixed GPUs does)."""
    scripts = workload(seed=1, agents=4, requests=100)
    chosen = simulate(anywhere(CARDS), scripts, load=10.0)
    assert chosen["answered"] == chosen["requests"] == 400
    assert chosen["cards_used"] == [0, 1, 2, 3]
    for a, _ in assignments(CARDS):
        run = simulate(fixed(CARDS, a), scripts, load=10.0, give_up=chosen["swaps"])
        assert run["swaps"] > chosen["swaps"], (layout(a), run["swaps"], chosen["swaps"])
