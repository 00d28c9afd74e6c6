"""llama-server flags that change the KV cache and the micro-batch: -ub/-b, --kv-unified, --swa-full,
--no-kv-offload.

Headers are synthetic (no weights); expected byte counts are worked out by hand (see
tests/unit/placement_flag_models.py).
"""

from __future__ import annotations

from pathlib import Path

from router.placement.fit import plan_model
from router.placement.model_plan import PlacementInput
from tests.unit.placement_flag_models import GEMMA3_CELL, GEMMA3_SWA, ROOMY, GiB, MiB, header_only, plan_of

SWA, CELL = GEMMA3_SWA, GEMMA3_CELL
SLIDING, FULL = 20, 4


# ------------------------------------------------------------------------------------- micro-batch


def test_a_larger_ubatch_widens_every_sliding_window_by_the_difference(tmp_path: Path) -> None:
    path = header_only(tmp_path, SWA, "swa")
    small = plan_of(path, ctx=8192).rows[0]
    large = plan_of(path, ctx=8192, ubatch=1024).rows[0]
    # full layers: 8192 cells; sliding: pad256(min(8192, 1024 + 512)) = 1536 vs pad256(1024 + 1024) = 2048
    assert small.kv == FULL * CELL * 8192 + SLIDING * CELL * 1536
    assert large.kv - small.kv == SLIDING * CELL * 512 == 160 * MiB
    # compute: 4 * u * (2E + 4q + kv) = 4u * 32768, plus f16 masks over 8192 full and the sliding cells
    assert small.compute == 4 * 512 * 32768 + 8192 * 512 * 2 + 1536 * 512 * 2 == 77070336
    assert large.compute == 4 * 1024 * 32768 + 8192 * 1024 * 2 + 2048 * 1024 * 2 == 155189248


def test_ubatch_is_clamped_to_the_batch(tmp_path: Path) -> None:
    path = header_only(tmp_path, SWA, "swa")
    clamped = plan_of(path, ctx=8192, ubatch=1024, batch=512).rows[0]
    assert clamped == plan_of(path, ctx=8192).rows[0]


def test_unified_cache_holds_the_windows_of_all_slots_in_one_stream(tmp_path: Path) -> None:
    path = header_only(tmp_path, SWA, "swa")
    split = plan_of(path, ctx=8192, parallel=4).rows[0]
    unified = plan_of(path, ctx=8192, parallel=4, kv_unified=True).rows[0]
    # 4 streams of 2048 cells; sliding: 4 * pad256(min(2048, 1024 + 512)) = 6144 cells
    assert split.kv == FULL * CELL * 8192 + SLIDING * CELL * 6144
    # one stream of 8192; sliding: pad256(min(8192, 1024 * 4 + 512)) = 4608 cells
    assert unified.kv == FULL * CELL * 8192 + SLIDING * CELL * 4608
    assert split.kv - unified.kv == 480 * MiB


def test_swa_full_gives_sliding_layers_the_whole_context(tmp_path: Path) -> None:
    path = header_only(tmp_path, SWA, "swa")
    full = plan_of(path, ctx=8192, swa_full=True).rows[0]
    assert full.kv == 24 * CELL * 8192 == 3 * GiB


def test_no_kv_offload_moves_the_cache_to_host_memory(tmp_path: Path) -> None:
    path = header_only(tmp_path, SWA, "swa")
    on_gpu = plan_of(path, ctx=8192)
    on_host = plan_model(PlacementInput("m", path, kv_offload=False), ROOMY)
    assert on_host.verdict == "override" and "--no-kv-offload" in on_host.message
    fixed = plan_of(path, ctx=8192, kv_offload=False)
    assert fixed.rows[0].kv == 0 and fixed.rows[0].kv_per_token == 0
    assert fixed.rows[0].weights == on_gpu.rows[0].weights
    assert fixed.host_bytes - on_gpu.host_bytes == on_gpu.rows[0].kv
