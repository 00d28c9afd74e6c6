"""What the router tells the scheduler of other processes' memory (router.shell.foreign_watch): the bytes
beyond each GPU's budget, from trusted readings only, and only changes worth a scheduling pass."""

from __future__ import annotations

from router.placement.budgets import GpuMeasure
from router.placement.readings import GpuReading
from router.shell.foreign_watch import SIGNIFICANT, beyond_budget, worth_telling

GIB = 1 << 30


def measured(foreign: int, method: str = "processes", total: int = 8 * GIB) -> GpuMeasure:
    return GpuMeasure(GpuReading(0, total=total, used=foreign), foreign=foreign, ours=0, method=method)


def test_beyond_budget_counts_only_what_the_budget_did_not_leave() -> None:
    budgets = {0: 6 * GIB, 1: 6 * GIB, 2: None, 3: 6 * GIB}
    measures = {
        0: measured(1 * GIB),  # 7 GiB available against a budget of 6: nothing beyond it
        1: measured(5 * GIB),  # 3 GiB available: 3 GiB beyond
        2: measured(5 * GIB),  # no budget: nothing to compare with
        3: measured(5 * GIB, method="unattributed"),  # ours and theirs cannot be told apart: not told
    }
    assert beyond_budget(measures, budgets) == {0: 0, 1: 3 * GIB}


def test_only_changes_worth_a_pass_are_told() -> None:
    known = {0: 2 * GIB}
    assert worth_telling(known, {0: 2 * GIB + SIGNIFICANT - 1, 1: 0}) == {}
    assert worth_telling(known, {0: 2 * GIB + SIGNIFICANT}) == {0: 2 * GIB + SIGNIFICANT}
    assert worth_telling(known, {0: 0}) == {0: 0}  # back to nothing is always told
    assert worth_telling({}, {1: 1}) == {1: 1}  # and so is the first byte
