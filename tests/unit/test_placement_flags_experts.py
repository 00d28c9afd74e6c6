"""llama-server flags that keep tensors in host memory: --n-cpu-moe, --cpu-moe, --override-tensor.

Headers are synthetic (no weights); expected byte counts are worked out by hand (see
tests/unit/placement_flag_models.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from router.deploy.memory_flags import EXPERTS_REGEX, memory_flags
from router.placement.extras import host_tensor_bytes
from router.placement.fit import plan_model
from router.placement.gguf_header import read_header
from router.placement.model_plan import PlacementInput
from router.placement.synthetic import SyntheticModel
from tests.unit.placement_flag_models import ROOMY, header_only, plan_of, write_gguf

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
    return write_gguf(tmp_path / "moe.gguf", "moe", keys, tensors)


# ---------------------------------------------------------------------------------- expert offload


def test_n_cpu_moe_keeps_the_first_layers_experts_on_the_host(tmp_path: Path) -> None:
    path = _moe(tmp_path)
    patterns = memory_flags({}, {"n-cpu-moe": 2}, n_gpus=1, base_dir=tmp_path).host_patterns
    host = host_tensor_bytes(read_header(path), 4, patterns)
    assert host.by_layer == (EXPERTS_PER_LAYER, EXPERTS_PER_LAYER, 0, 0, 0) and host.count == 6

    base = plan_of(path, ctx=4096)
    moved = plan_of(path, ctx=4096, host_patterns=patterns, host_flags=("--n-cpu-moe 2",))
    assert base.rows[0].weights - moved.rows[0].weights == 2 * EXPERTS_PER_LAYER
    assert moved.host_bytes - base.host_bytes == 2 * EXPERTS_PER_LAYER
    # op offload: one host-kept layer at a time is copied into the first GPU's compute buffer
    assert moved.rows[0].compute - base.rows[0].compute == EXPERTS_PER_LAYER
    kept = plan_of(path, ctx=4096, host_patterns=patterns, op_offload=False)
    assert kept.rows[0].compute == base.rows[0].compute

    auto = plan_model(PlacementInput("m", path, host_patterns=patterns, host_flags=("--n-cpu-moe 2",)), ROOMY)
    assert auto.verdict == "override"
    assert "--n-cpu-moe 2 (keeps 6 tensors, 3.0 MiB of weights, in host memory)" in auto.message


def test_cpu_moe_and_override_tensor(tmp_path: Path) -> None:
    path = _moe(tmp_path)
    base = plan_of(path, ctx=4096)
    every = memory_flags({}, {"cmoe": True}, n_gpus=1, base_dir=tmp_path)
    assert every.host_patterns == (EXPERTS_REGEX,) and every.host_flags == ("-cmoe",)
    all_experts = plan_of(path, ctx=4096, host_patterns=every.host_patterns)
    assert base.rows[0].weights - all_experts.rows[0].weights == 4 * EXPERTS_PER_LAYER
    one = memory_flags({}, {"ot": r"blk\.3\.ffn_down_exps=CPU,output\.=CPU"}, n_gpus=1, base_dir=tmp_path)
    assert one.host_patterns == (r"blk\.3\.ffn_down_exps", r"output\.")
    moved = plan_of(path, ctx=4096, host_patterns=one.host_patterns)
    # one expert tensor of layer 3, output.weight (1000 x 256 f16) and, since a pattern may match anywhere
    # in the name (std::regex_search), the four blk.N.attn_output.weight (256 x 256 f16); not output_norm
    moved_bytes = 524288 + 512000 + 4 * 131072
    assert base.rows[0].weights - moved.rows[0].weights == moved_bytes
    assert moved.host_bytes - base.host_bytes == moved_bytes


def test_patterns_that_match_nothing_still_count_as_an_operator_setting(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "dense")
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
