"""llama-server flags that move memory: how they are read, and what placement adds for them.

Headers are synthetic (no weights). Expected byte counts are worked out by hand from llama.cpp's rules
(router/placement/kv_layout.py, router/placement/footprint.py, router/placement/extras.py,
router/deploy/memory_flags.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from router.config.load import load_config
from router.deploy.bridge import placement_inputs
from router.deploy.memory_flags import EXPERTS_REGEX, flash_attn, memory_flags
from router.placement.extras import DraftInput, host_tensor_bytes, projector_from_header
from router.placement.fit import plan_model
from router.placement.footprint import estimate
from router.placement.geometry import geometry_from_header
from router.placement.gguf_header import read_header
from router.placement.model_plan import ModelPlan, PlacementInput
from router.placement.plan import format_plan_table, plan_document
from router.placement.synthetic import SyntheticModel, write_header_only
from tests.support.harness import post_chat, running_router
from tests.support.simtools import write_sim_sidecar

MiB = 1 << 20
GiB = 1 << 30
ROOMY = {0: 64 * GiB, 1: 64 * GiB}

# gemma3: layer i slides unless i % 6 == 5, so 20 of 24 layers slide (window 1024). 32 KV heads of 128:
# one cell of one layer is 32*128*2 bytes of K plus as much V = 16384 bytes.
SWA = SyntheticModel(
    arch="gemma3",
    n_layer=24,
    n_embd=4096,
    n_head=32,
    n_head_kv=32,
    n_ff=1024,
    n_vocab=1024,
    n_ctx_train=32768,
    extra=((".attention.sliding_window", 1024),),
)
CELL = 16384
SLIDING, FULL = 20, 4


def _path(tmp_path: Path, model: SyntheticModel, name: str) -> Path:
    (path,) = write_header_only(tmp_path / f"{name}.gguf", model)
    return path


def _write(
    path: Path, arch: str, keys: dict[str, Any], tensors: Sequence[tuple[str, tuple[int, ...], str]]
) -> Path:
    """A header-only GGUF with these keys (ints as uint32) and tensors (numpy-order shapes, ggml type)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, arch)
    for key, value in keys.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    for name, shape, type_name in tensors:
        t = gguf.GGMLQuantizationType[type_name.upper()]
        block, size = gguf.GGML_QUANT_SIZES[t]
        n = int(np.prod(shape))
        w.add_tensor_info(name, shape, np.dtype(np.float32), n // block * size, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


# A small MoE: 4 layers, 8 experts of width 128 over n_embd 256, f16. Each expert tensor is
# 8*128*256*2 = 524288 bytes, three per layer (gate, up, down): 1572864 bytes = 1.5 MiB per layer.
EXPERTS_PER_LAYER = 3 * 524288


def _moe(tmp_path: Path) -> Path:
    e, n_layer = 256, 4
    tensors: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (1000, e), "f16")]
    for i in range(n_layer):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (e,), "f32"),
            (f"blk.{i}.attn_q.weight", (e, e), "f16"),
            (f"blk.{i}.attn_k.weight", (128, e), "f16"),
            (f"blk.{i}.attn_v.weight", (128, e), "f16"),
            (f"blk.{i}.attn_output.weight", (e, e), "f16"),
            (f"blk.{i}.ffn_norm.weight", (e,), "f32"),
            (f"blk.{i}.ffn_gate_inp.weight", (8, e), "f32"),
            (f"blk.{i}.ffn_gate_exps.weight", (8, 128, e), "f16"),
            (f"blk.{i}.ffn_up_exps.weight", (8, 128, e), "f16"),
            (f"blk.{i}.ffn_down_exps.weight", (8, e, 128), "f16"),
        ]
    tensors += [("output_norm.weight", (e,), "f32"), ("output.weight", (1000, e), "f16")]
    keys = {
        "moe.block_count": n_layer,
        "moe.context_length": 4096,
        "moe.embedding_length": e,
        "moe.attention.head_count": 4,
        "moe.attention.head_count_kv": 2,
        "moe.expert_count": 8,
        "moe.expert_used_count": 2,
        "moe.expert_feed_forward_length": 128,
        "moe.vocab_size": 1000,
    }
    return _write(tmp_path / "moe.gguf", "moe", keys, tensors)


# A projector: three tensors of 301056 + 262144 + 131072 = 694272 bytes.
PROJECTOR_BYTES = 694272
GEMMA3_VISION = {
    "clip.has_vision_encoder": True,
    "clip.vision.image_size": 896,
    "clip.vision.patch_size": 14,
    "clip.vision.embedding_length": 1152,
    "clip.vision.feed_forward_length": 4304,
    "clip.vision.attention.head_count": 16,
}


def _projector(tmp_path: Path, keys: dict[str, Any] = GEMMA3_VISION) -> Path:
    tensors = [
        ("v.patch_embd.weight", (256, 588), "f16"),
        ("v.blk.0.ffn_up.weight", (512, 256), "f16"),
        ("mm.0.weight", (256, 256), "f16"),
    ]
    return _write(tmp_path / "mmproj.gguf", "clip", keys, tensors)


def _plan(path: Path, devices: dict[Any, int | None] = ROOMY, **kw: Any) -> ModelPlan:
    plan = plan_model(PlacementInput("m", path, **kw), devices)
    assert plan.verdict not in ("error", "refused"), plan.message
    return plan


# ------------------------------------------------------------------------------------- micro-batch


def test_a_larger_ubatch_widens_every_sliding_window_by_the_difference(tmp_path: Path) -> None:
    path = _path(tmp_path, SWA, "swa")
    small = _plan(path, ctx=8192).rows[0]
    large = _plan(path, ctx=8192, ubatch=1024).rows[0]
    # full layers: 8192 cells; sliding: pad256(min(8192, 1024 + 512)) = 1536 vs pad256(1024 + 1024) = 2048
    assert small.kv == FULL * CELL * 8192 + SLIDING * CELL * 1536
    assert large.kv - small.kv == SLIDING * CELL * 512 == 160 * MiB
    # compute: 4 * u * (2E + 4q + kv) = 4u * 32768, plus f16 masks over 8192 full and the sliding cells
    assert small.compute == 4 * 512 * 32768 + 8192 * 512 * 2 + 1536 * 512 * 2 == 77070336
    assert large.compute == 4 * 1024 * 32768 + 8192 * 1024 * 2 + 2048 * 1024 * 2 == 155189248


def test_ubatch_is_clamped_to_the_batch(tmp_path: Path) -> None:
    path = _path(tmp_path, SWA, "swa")
    clamped = _plan(path, ctx=8192, ubatch=1024, batch=512).rows[0]
    assert clamped == _plan(path, ctx=8192).rows[0]


def test_unified_cache_holds_the_windows_of_all_slots_in_one_stream(tmp_path: Path) -> None:
    path = _path(tmp_path, SWA, "swa")
    split = _plan(path, ctx=8192, parallel=4).rows[0]
    unified = _plan(path, ctx=8192, parallel=4, kv_unified=True).rows[0]
    # 4 streams of 2048 cells; sliding: 4 * pad256(min(2048, 1024 + 512)) = 6144 cells
    assert split.kv == FULL * CELL * 8192 + SLIDING * CELL * 6144
    # one stream of 8192; sliding: pad256(min(8192, 1024 * 4 + 512)) = 4608 cells
    assert unified.kv == FULL * CELL * 8192 + SLIDING * CELL * 4608
    assert split.kv - unified.kv == 480 * MiB


def test_swa_full_gives_sliding_layers_the_whole_context(tmp_path: Path) -> None:
    path = _path(tmp_path, SWA, "swa")
    full = _plan(path, ctx=8192, swa_full=True).rows[0]
    assert full.kv == 24 * CELL * 8192 == 3 * GiB


def test_no_kv_offload_moves_the_cache_to_host_memory(tmp_path: Path) -> None:
    path = _path(tmp_path, SWA, "swa")
    on_gpu = _plan(path, ctx=8192)
    on_host = plan_model(PlacementInput("m", path, kv_offload=False), ROOMY)
    assert on_host.verdict == "override" and "--no-kv-offload" in on_host.message
    fixed = _plan(path, ctx=8192, kv_offload=False)
    assert fixed.rows[0].kv == 0 and fixed.rows[0].kv_per_token == 0
    assert fixed.rows[0].weights == on_gpu.rows[0].weights
    assert fixed.host_bytes - on_gpu.host_bytes == on_gpu.rows[0].kv


# ---------------------------------------------------------------------------------- expert offload


def test_n_cpu_moe_keeps_the_first_layers_experts_on_the_host(tmp_path: Path) -> None:
    path = _moe(tmp_path)
    patterns = memory_flags({}, {"n-cpu-moe": 2}, n_gpus=1, base_dir=tmp_path).host_patterns
    host = host_tensor_bytes(read_header(path), 4, patterns)
    assert host.by_layer == (EXPERTS_PER_LAYER, EXPERTS_PER_LAYER, 0, 0, 0) and host.count == 6

    base = _plan(path, ctx=4096)
    moved = _plan(path, ctx=4096, host_patterns=patterns, host_flags=("--n-cpu-moe 2",))
    assert base.rows[0].weights - moved.rows[0].weights == 2 * EXPERTS_PER_LAYER
    assert moved.host_bytes - base.host_bytes == 2 * EXPERTS_PER_LAYER
    # op offload: one host-kept layer at a time is copied into the first GPU's compute buffer
    assert moved.rows[0].compute - base.rows[0].compute == EXPERTS_PER_LAYER
    kept = _plan(path, ctx=4096, host_patterns=patterns, op_offload=False)
    assert kept.rows[0].compute == base.rows[0].compute

    auto = plan_model(PlacementInput("m", path, host_patterns=patterns, host_flags=("--n-cpu-moe 2",)), ROOMY)
    assert auto.verdict == "override"
    assert "--n-cpu-moe 2 (keeps 6 tensors, 3.0 MiB of weights, in host memory)" in auto.message


def test_cpu_moe_and_override_tensor(tmp_path: Path) -> None:
    path = _moe(tmp_path)
    base = _plan(path, ctx=4096)
    every = memory_flags({}, {"cmoe": True}, n_gpus=1, base_dir=tmp_path)
    assert every.host_patterns == (EXPERTS_REGEX,) and every.host_flags == ("-cmoe",)
    all_experts = _plan(path, ctx=4096, host_patterns=every.host_patterns)
    assert base.rows[0].weights - all_experts.rows[0].weights == 4 * EXPERTS_PER_LAYER
    one = memory_flags({}, {"ot": r"blk\.3\.ffn_down_exps=CPU,output\.=CPU"}, n_gpus=1, base_dir=tmp_path)
    assert one.host_patterns == (r"blk\.3\.ffn_down_exps", r"output\.")
    moved = _plan(path, ctx=4096, host_patterns=one.host_patterns)
    # one expert tensor of layer 3, output.weight (1000 x 256 f16) and, since a pattern may match anywhere
    # in the name (std::regex_search), the four blk.N.attn_output.weight (256 x 256 f16); not output_norm
    moved_bytes = 524288 + 512000 + 4 * 131072
    assert base.rows[0].weights - moved.rows[0].weights == moved_bytes
    assert moved.host_bytes - base.host_bytes == moved_bytes


def test_patterns_that_match_nothing_still_count_as_an_operator_setting(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "dense")
    plan = plan_model(
        PlacementInput("m", path, host_patterns=(EXPERTS_REGEX,), host_flags=("--cpu-moe",)), ROOMY
    )
    assert plan.verdict == "override" and "--cpu-moe (matches no tensor: nothing moved)" in plan.message


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("exps=CUDA0", "only the host buffer type CPU can be modelled"),
        ("exps=cpu", "knows the host buffer type only as CPU, upper case"),
        ("exps", "expects PATTERN=BUFFER_TYPE"),
        ("blk.(=CPU", "not a regular expression"),
    ],
)
def test_override_tensor_that_cannot_be_modelled_is_refused_by_name(
    tmp_path: Path, value: str, why: str
) -> None:
    flags = memory_flags({}, {"--override-tensor": value}, n_gpus=1, base_dir=tmp_path)
    (reason,) = flags.unsupported
    assert reason.startswith(f"--override-tensor {value} (") and why in reason


# -------------------------------------------------------------------------------------- projector


def test_projector_goes_to_the_first_gpu_with_its_compute(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    proj = _projector(tmp_path)
    header = projector_from_header(read_header(proj))
    # 896/14 = 64 -> 4096 positions; 4 * 4096 * (6 * 1152 + 3 * 4304) = 324796416 bytes of activations;
    # without flash attention also the scores 4 * 16 * 4096^2 = 1 GiB
    assert header.weights == PROJECTOR_BYTES
    assert header.compute_flash == 4 * 4096 * (6 * 1152 + 3 * 4304) == 324796416
    assert header.compute_plain == 324796416 + GiB

    base = _plan(path, ctx=4096, gpus=(0, 1))
    with_proj = _plan(path, ctx=4096, gpus=(0, 1), mmproj=proj)
    first, second = with_proj.rows
    assert first.weights - base.rows[0].weights == PROJECTOR_BYTES
    assert first.compute - base.rows[0].compute == 324796416
    assert first.projector == PROJECTOR_BYTES + 324796416
    assert second == base.rows[1]
    assert with_proj.verdict == "override"  # ctx given; without it the projector alone is no override
    assert _plan(path, mmproj=proj).verdict == "fits"
    plain = _plan(path, ctx=4096, mmproj=proj, flash_attn=False)
    assert plain.rows[0].projector == PROJECTOR_BYTES + 324796416 + GiB


def test_projector_without_image_keys_gets_the_fixed_margin(tmp_path: Path) -> None:
    proj = _projector(tmp_path, {"clip.has_audio_encoder": True})
    header = projector_from_header(read_header(proj))
    assert header.compute_flash == header.compute_plain == 512 * MiB


def test_no_mmproj_offload_keeps_the_projector_in_host_memory(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    proj = _projector(tmp_path)
    base = _plan(path)
    host = _plan(path, mmproj=proj, mmproj_offload=False)
    assert host.rows == base.rows and host.ctx == base.ctx
    assert host.host_bytes - base.host_bytes == PROJECTOR_BYTES
    assert (
        host.verdict == "override"
        and "--no-mmproj-offload (the projector's 0.7 MiB in host memory)" in host.message
    )


def test_a_missing_projector_is_an_error_naming_it(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    plan = plan_model(PlacementInput("m", path, mmproj=tmp_path / "nope.gguf"), ROOMY)
    assert (
        plan.verdict == "error"
        and "cannot read the projector" in plan.message
        and "nope.gguf" in plan.message
    )


# ------------------------------------------------------------------------------------ draft model

# Draft: 2 layers of n_embd 128, 4 heads of 32, 2 KV heads; a layer is 295936 bytes of weights, the output
# layer 262656; one cell of one layer 2*32*2 (K) + 2*32*2 (V) = 256 bytes.
DRAFT = SyntheticModel(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=1024)
DRAFT_GPU_WEIGHTS = 2 * 295936 + 262656


def test_draft_model_adds_its_weights_kv_and_compute(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    draft = _path(tmp_path, DRAFT, "draft")
    base = _plan(path, ctx=4096)
    plan = _plan(path, ctx=4096, draft=DraftInput(draft))
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

    q8 = _plan(path, ctx=4096, draft=DraftInput(draft, cache_type_k="q8_0", cache_type_v="q8_0"))
    # q8_0: 64 elements = 2 blocks of 34 bytes per K and per V row
    assert q8.rows[0].kv - main.kv == 2 * (68 + 68) * 4096
    short = _plan(path, ctx=4096, draft=DraftInput(draft, ctx=2048))
    assert short.rows[0].kv - main.kv == 2 * 256 * 2048


def test_partial_draft_offload_is_an_operator_setting(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    draft = _path(tmp_path, DRAFT, "draft")
    full = _plan(path, draft=DraftInput(draft))
    assert full.verdict == "fits"
    partial = _plan(path, draft=DraftInput(draft, gpu_layers=1))
    assert (
        partial.verdict == "override"
        and "gpu-layers-draft=1 (2 of 3 draft layers on the CPU)" in partial.message
    )
    # -ngld 1 offloads only the output layer: both blocks stay in host memory
    assert partial.host_bytes - full.host_bytes == 2 * 295936


def test_draft_splits_like_the_main_model(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    draft = _path(tmp_path, DRAFT, "draft")
    base = _plan(path, ctx=4096, gpus=(0, 1))
    plan = _plan(path, ctx=4096, gpus=(0, 1), draft=DraftInput(draft))
    # 3 draft slots (2 blocks + output) over two equal GPUs: block 0 and 1 on GPU 0 (0/3, 1/3 < 1/2),
    # the output layer on GPU 1
    assert plan.rows[0].weights - base.rows[0].weights == 2 * 295936
    assert plan.rows[1].weights - base.rows[1].weights == 262656


# ------------------------------------------------------------------------------------- split mode


def test_operator_tensor_split_replaces_the_budget_split(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(n_layer=7), "m")
    plan = _plan(path, gpus=(0, 1), tensor_split=(3.0, 1.0))
    assert [r.layers for r in plan.rows] == [6, 1]  # 8 slots at 3:1: blocks 0-5 | block 6 and the output
    assert plan.tensor_split == ()  # the operator's --tensor-split is already on the command line
    none = memory_flags({}, {"sm": "none"}, n_gpus=2, base_dir=tmp_path)
    assert none.tensor_split == (1.0, 0.0) and not none.unsupported
    assert memory_flags({}, {"ts": "3/1"}, n_gpus=2, base_dir=tmp_path).tensor_split == (3.0, 1.0)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"sm": "row"}, "-sm row (splits each weight matrix by rows across the GPUs"),
        ({"split-mode": "tensor"}, "--split-mode tensor (splits weights and the KV cache"),
        ({"lora": "adapter.gguf"}, "--lora (LoRA adapter"),
        ({"lora-scaled": "adapter.gguf:0.5"}, "--lora-scaled (LoRA adapter"),
        ({"control-vector": "cv.gguf"}, "--control-vector (control vectors"),
        ({"control-vector-layer-range": "1 4"}, "--control-vector-layer-range (control vectors"),
        ({"rpc": "10.0.0.2:50052"}, "--rpc (layers may be placed on remote devices"),
        ({"-devd": "CUDA1", "-md": "d.gguf"}, "-devd (a device name"),
        ({"ub": "big"}, "-ub big (not a whole number)"),
        ({"b": 0}, "-b 0 (must be at least 1)"),
    ],
)
def test_what_placement_cannot_model_is_refused_by_name(
    tmp_path: Path, flags: dict[str, Any], named: str
) -> None:
    reading = memory_flags({}, flags, n_gpus=2, base_dir=tmp_path)
    assert any(r.startswith(named) for r in reading.unsupported), reading.unsupported
    path = _path(tmp_path, SyntheticModel(), "m")
    plan = plan_model(PlacementInput("m", path, gpus=(0, 1), unsupported=reading.unsupported), ROOMY)
    assert plan.verdict == "refused" and not plan.ok and plan.rows == () and plan.ctx is None
    assert plan.message.startswith("m: placement cannot predict the memory of ") and named in plan.message


def test_row_split_on_one_gpu_is_just_that_gpu(tmp_path: Path) -> None:
    assert memory_flags({}, {"sm": "row"}, n_gpus=1, base_dir=tmp_path).unsupported == ()


# ---------------------------------------------------------------------------------- flag reading


def test_spellings_merging_and_false(tmp_path: Path) -> None:
    read = memory_flags({"ub": 1024, "b": 4096, "-kvu": True}, {}, n_gpus=1, base_dir=tmp_path)
    assert (read.ubatch, read.batch, read.kv_unified) == (1024, 4096, True)
    # the model's value replaces the default's; false drops it
    read = memory_flags(
        {"ub": 1024, "kvu": True}, {"--ubatch-size": "2048", "kv-unified": False}, n_gpus=1, base_dir=tmp_path
    )
    assert (read.ubatch, read.kv_unified) == (2048, False)
    read = memory_flags({"ub": 1024}, {"ub": False}, n_gpus=1, base_dir=tmp_path)
    assert read.ubatch == 512
    # a negative form later on the command line wins
    read = memory_flags(
        {"kvu": True, "nkvo": True}, {"no-kvu": True, "kvo": True}, n_gpus=1, base_dir=tmp_path
    )
    assert (read.kv_unified, read.kv_offload) == (False, True)
    read = memory_flags(
        {}, {"swa-full": True, "nkvo": True, "no-op-offload": True}, n_gpus=1, base_dir=tmp_path
    )
    assert (read.swa_full, read.kv_offload, read.op_offload) == (True, False, False)


def test_flash_attention_values() -> None:
    assert flash_attn({}, {}) is True
    assert flash_attn({"fa": "off"}, {}) is False
    assert flash_attn({"fa": "disabled"}, {}) is False
    assert flash_attn({"fa": "off"}, {"fa": False}) is True  # false drops the flag: llama-server's auto
    assert flash_attn({"--flash-attn": "on"}, {}) is True


def test_paths_and_draft_flags(tmp_path: Path) -> None:
    read = memory_flags(
        {"ctkd": "q8_0"},
        {
            "mmproj": "proj/mm.gguf",
            "no-mmproj-offload": True,
            "--spec-draft-model": "~/d.gguf",
            "ngld": 5,
            "cd": 1024,
            "ctvd": "q4_0",
            "ncmoed": 1,
            "spec-draft-n-max": 8,
        },
        n_gpus=1,
        base_dir=tmp_path,
    )
    assert read.mmproj == tmp_path / "proj" / "mm.gguf" and read.mmproj_offload is False
    draft = read.draft
    assert draft is not None and draft.path == Path("~/d.gguf").expanduser()
    assert (draft.gpu_layers, draft.ctx, draft.cache_type_k, draft.cache_type_v, draft.n_max) == (
        5,
        1024,
        "q8_0",
        "q4_0",
        8,
    )
    assert draft.host_patterns == (rf"blk\.0{EXPERTS_REGEX}",)
    assert memory_flags(
        {}, {"md": "/d.gguf", "ngld": "all"}, n_gpus=1, base_dir=tmp_path
    ).draft == DraftInput("/d.gguf")
    # draft flags without a draft model mean nothing
    assert memory_flags({}, {"ngld": 3, "ctkd": "q8_0"}, n_gpus=1, base_dir=tmp_path).draft is None


def test_placement_inputs_read_the_config(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(
        "[defaults]\nub = 1024\nkvu = true\n\n"
        '[models.m]\nmodel = "m.gguf"\ngpus = [0]\nmmproj = "proj/mm.gguf"\nub = false\n'
        '"--n-cpu-moe" = 2\nb = 256\n'
    )
    (inp,) = placement_inputs(load_config(config, env={}), (0,))
    assert (inp.ubatch, inp.batch, inp.kv_unified) == (512, 256, True)
    assert inp.mmproj == tmp_path / "proj" / "mm.gguf"
    assert inp.host_flags == ("--n-cpu-moe 2",) and len(inp.host_patterns) == 2


def test_plan_document_and_table_show_host_bytes_and_companions(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    plan = _plan(
        path, ctx=4096, mmproj=_projector(tmp_path), draft=DraftInput(_path(tmp_path, DRAFT, "draft"))
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


async def test_a_refused_flag_reaches_the_client_by_name(tmp_path: Path) -> None:
    path = _path(tmp_path, SyntheticModel(), "m")
    write_sim_sidecar(path, load_delay=0.05, record_dir=str(tmp_path / "records"))
    models = {"m": {"sim": {}, "model": str(path), "gpus": [0, 1], "sm": "row"}}
    devices = {"0": {"memory_mib": 4096}, "1": {"memory_mib": 4096}}
    async with running_router(tmp_path, models, devices=devices) as rt:
        reply = await post_chat(rt.client, "m")
        assert reply.status_code == 503
        message = reply.json()["error"]["message"]
        assert "placement cannot predict the memory of -sm row (splits each weight matrix" in message
