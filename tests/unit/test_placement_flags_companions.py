"""A projector (--mmproj, --no-mmproj-offload) and a draft model (-md and its -*d flags): what placement
adds for them, and how the plan shows them.

Headers are synthetic (no weights); expected byte counts are worked out by hand (see
tests/unit/placement_flag_models.py).
"""

from __future__ import annotations

from pathlib import Path

from router.placement.extras import DraftInput, projector_from_header
from router.placement.fit import plan_model
from router.placement.footprint import estimate
from router.placement.geometry import geometry_from_header
from router.placement.gguf_header import read_header
from router.placement.model_plan import PlacementInput
from router.placement.plan import format_plan_table, plan_document
from router.placement.synthetic import SyntheticModel
from tests.unit.placement_flag_models import (
    DRAFT,
    DRAFT_GPU_WEIGHTS,
    PROJECTOR_BYTES,
    ROOMY,
    GiB,
    MiB,
    header_only,
    plan_of,
    projector_gguf,
)

# -------------------------------------------------------------------------------------- projector


def test_projector_goes_to_the_first_gpu_with_its_compute(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    proj = projector_gguf(tmp_path)
    header = projector_from_header(read_header(proj))
    # 896/14 = 64 -> 4096 positions; 4 * 4096 * (6 * 1152 + 3 * 4304) = 324796416 bytes of activations;
    # without flash attention also the scores 4 * 16 * 4096^2 = 1 GiB
    assert header.weights == PROJECTOR_BYTES
    assert header.compute_flash == 4 * 4096 * (6 * 1152 + 3 * 4304) == 324796416
    assert header.compute_plain == 324796416 + GiB

    base = plan_of(path, ctx=4096, gpus=(0, 1))
    with_proj = plan_of(path, ctx=4096, gpus=(0, 1), mmproj=proj)
    first, second = with_proj.rows
    assert first.weights - base.rows[0].weights == PROJECTOR_BYTES
    assert first.compute - base.rows[0].compute == 324796416
    assert first.projector == PROJECTOR_BYTES + 324796416
    assert second == base.rows[1]
    assert with_proj.verdict == "override"  # ctx given; without it the projector alone is no override
    assert plan_of(path, mmproj=proj).verdict == "fits"
    plain = plan_of(path, ctx=4096, mmproj=proj, flash_attn=False)
    assert plain.rows[0].projector == PROJECTOR_BYTES + 324796416 + GiB


def test_projector_without_image_keys_gets_the_fixed_margin(tmp_path: Path) -> None:
    proj = projector_gguf(tmp_path, {"clip.has_audio_encoder": True})
    header = projector_from_header(read_header(proj))
    assert header.compute_flash == header.compute_plain == 512 * MiB


def test_no_mmproj_offload_keeps_the_projector_in_host_memory(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    proj = projector_gguf(tmp_path)
    base = plan_of(path)
    host = plan_of(path, mmproj=proj, mmproj_offload=False)
    assert host.rows == base.rows and host.ctx == base.ctx
    assert host.host_bytes - base.host_bytes == PROJECTOR_BYTES
    assert (
        host.verdict == "override"
        and "--no-mmproj-offload (the projector's 0.7 MiB in host memory)" in host.message
    )


def test_a_missing_projector_is_an_error_naming_it(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    plan = plan_model(PlacementInput("m", path, mmproj=tmp_path / "nope.gguf"), ROOMY)
    assert (
        plan.verdict == "error"
        and "cannot read the projector" in plan.message
        and "nope.gguf" in plan.message
    )


def test_draft_model_adds_its_weights_kv_and_compute(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    draft = header_only(tmp_path, DRAFT, "draft")
    base = plan_of(path, ctx=4096)
    plan = plan_of(path, ctx=4096, draft=DraftInput(draft))
    row, main = plan.rows[0], base.rows[0]
    draft_compute = (
        estimate(geometry_from_header(read_header(draft)), (0,), ctx=4096, reserve=0).devices[0].compute
    )
    assert row.weights - main.weights == DRAFT_GPU_WEIGHTS
    assert row.kv - main.kv == 2 * 256 * 4096  # the draft context follows -c
    assert row.compute - main.compute == draft_compute
    assert row.draft == DRAFT_GPU_WEIGHTS + 2 * 256 * 4096 + draft_compute
    assert row.reserve == main.reserve
    assert plan.host_bytes - base.host_bytes == 1024 * 128 * 2  # the draft's token_embd

    q8 = plan_of(path, ctx=4096, draft=DraftInput(draft, cache_type_k="q8_0", cache_type_v="q8_0"))
    # q8_0: 64 elements = 2 blocks of 34 bytes per K and per V row
    assert q8.rows[0].kv - main.kv == 2 * (68 + 68) * 4096
    short = plan_of(path, ctx=4096, draft=DraftInput(draft, ctx=2048))
    assert short.rows[0].kv - main.kv == 2 * 256 * 2048


def test_partial_draft_offload_is_an_operator_setting(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    draft = header_only(tmp_path, DRAFT, "draft")
    full = plan_of(path, draft=DraftInput(draft))
    assert full.verdict == "fits"
    partial = plan_of(path, draft=DraftInput(draft, gpu_layers=1))
    assert (
        partial.verdict == "override"
        and "gpu-layers-draft=1 (2 of 3 draft layers on the CPU)" in partial.message
    )
    # -ngld 1 offloads only the output layer: both blocks stay in host memory
    assert partial.host_bytes - full.host_bytes == 2 * 295936


def test_draft_splits_like_the_main_model(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    draft = header_only(tmp_path, DRAFT, "draft")
    base = plan_of(path, ctx=4096, gpus=(0, 1))
    plan = plan_of(path, ctx=4096, gpus=(0, 1), draft=DraftInput(draft))
    # 3 draft slots (2 blocks + output) over two equal GPUs: block 0 and 1 on GPU 0 (0/3, 1/3 < 1/2),
    # the output layer on GPU 1
    assert plan.rows[0].weights - base.rows[0].weights == 2 * 295936
    assert plan.rows[1].weights - base.rows[1].weights == 262656


def test_plan_document_and_table_show_host_bytes_and_companions(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    plan = plan_of(
        path,
        ctx=4096,
        mmproj=projector_gguf(tmp_path),
        draft=DraftInput(header_only(tmp_path, DRAFT, "draft")),
    )
    doc = plan_document([plan], {0: 64 * GiB})
    (row,) = doc["models"][0]["devices"]
    assert (
        row["projector_bytes"] == plan.rows[0].projector > 0 and row["draft_bytes"] == plan.rows[0].draft > 0
    )
    assert row["total_bytes"] == sum(
        row[k] for k in ("weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes", "reserve_bytes")
    )
    assert doc["models"][0]["host_bytes"] == plan.host_bytes
    header = next(line for line in format_plan_table(doc).splitlines() if line.startswith("model "))
    assert header.split()[-2:] == ["host", "replicas"]
