"""Placement of a model the scheduler places (``gpus = "any"``): the GPU sets it may load on and the one
context they share, from a real GGUF header (router.placement.anywhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.placement.anywhere import fits, plan_anywhere
from router.placement.fit import plan_model
from router.placement.model_plan import PlacementInput
from router.placement.synthetic import SyntheticModel, write_header_only

GiB = 1 << 30
RESERVE = 256 << 20

# ~1.3 GiB of f16 weights, trained on 32k tokens: the cards below decide its context.
MODEL = SyntheticModel(
    n_layer=16, n_embd=2048, n_head=16, n_head_kv=4, n_ff=5632, n_vocab=32000, n_ctx_train=32768
)


@pytest.fixture
def inp(tmp_path: Path) -> PlacementInput:
    (path,) = write_header_only(tmp_path / "m.gguf", MODEL)
    return PlacementInput("m", path)


def test_one_card_each_and_the_context_every_card_holds(inp: PlacementInput) -> None:
    budgets = {0: 24 * GiB, 1: 2 * GiB, 2: 1 * GiB}
    placed = plan_anywhere(inp, budgets, RESERVE, (0, 1, 2), None)
    sets = [gpus for gpus, _ in placed.choices]
    # The 1 GiB card holds not even the weights; the 2 GiB card limits the context both others get.
    assert sets[:2] == [(0,), (1,)] and (2,) not in sets
    alone = plan_model(PlacementInput("m", inp.path, gpus=(1,)), {1: 2 * GiB}, RESERVE)
    assert placed.ctx == alone.ctx and placed.ctx is not None and placed.ctx < 32768
    assert all(fits(plan) and plan.ctx == placed.ctx for _, plan in placed.choices)
    assert "on one GPU: GPU 0" in placed.explanation and "not on GPU 2 (too small)" in placed.explanation
    assert f"ctx {placed.ctx} is the largest that fits every one of them" in placed.explanation


def test_split_only_when_no_card_holds_it(inp: PlacementInput) -> None:
    budgets = {0: 3 * GiB // 2, 1: 3 * GiB // 2, 2: 3 * GiB // 2}
    placed = plan_anywhere(inp, budgets, RESERVE, (0, 1, 2), None)
    # The fewest cards that hold it, and one more card as a fallback (for when pinned models hold those).
    assert [gpus for gpus, _ in placed.choices] == [(0, 1), (0, 2), (1, 2), (0, 1, 2)]
    assert all(len(plan.need_by_gpu) == len(gpus) and fits(plan) for gpus, plan in placed.choices)
    assert placed.explanation.startswith("placed by the scheduler at each load on 2 GPUs: GPU 0 + GPU 1")
    # gpus_max = 1 forbids the split: refused, with the arithmetic.
    alone = plan_anywhere(inp, budgets, RESERVE, (0, 1, 2), 1)
    assert not alone.choices and "fits no set of at most 1 GPU(s) of GPU 0, GPU 1, GPU 2" in alone.explanation


def test_a_configured_context_is_kept_and_cards_it_does_not_fit_are_left_out(inp: PlacementInput) -> None:
    budgets = {0: 24 * GiB, 1: 2 * GiB}
    configured = PlacementInput("m", inp.path, ctx=32768)
    placed = plan_anywhere(configured, budgets, RESERVE, (0, 1), None)
    assert placed.ctx == 32768 and [gpus for gpus, _ in placed.choices][:1] == [(0,)]
    assert (1,) not in [gpus for gpus, _ in placed.choices]
