"""The swap benchmark's goals, on its own simulation (the scheduler with a simulated clock: exact, not timed):
two closed-loop agents on two models that cannot share their GPU, 100 requests each, swap at least 4× less
often under the default batching order than under strict arrival order, finish sooner, and no request waits
past the bound of the batch window, a drain, a stop and a load."""

from __future__ import annotations

from benchmarks.bench_swaps import POLICIES, simulate


def test_batching_swaps_four_times_less_than_strict_order_and_keeps_its_bound() -> None:
    runs = {name: simulate(policy, ["a", "b"], 10.0, 2.0, 0.05, 100) for name, policy in POLICIES.items()}
    strict, batching = runs["strict"], runs["batching"]
    assert strict["answered"] == batching["answered"] == 200
    assert strict["swaps_per_100"] >= 4 * batching["swaps_per_100"]
    assert batching["total_s"] < strict["total_s"]
    assert batching["within_bound"], batching
