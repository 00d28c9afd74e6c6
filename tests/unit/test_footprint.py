"""Footprint arithmetic on synthetic headers: KV layouts, sliding windows, recurrent state, weights, splits.

Expected values are worked out by hand from llama.cpp's rules (see router/placement/geometry.py,
kv_layout.py and footprint.py), not recomputed with the modules' own helpers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from router.placement.footprint import CPU, assign_layers, estimate
from router.placement.geometry import FootprintError, ModelGeometry, geometry_from_header
from router.placement.gguf_header import read_header
from router.placement.kv_layout import CACHE_TYPES, context_layout, kv_cell_bytes
from router.placement.synthetic import SyntheticModel, write_header_only

MiB = 1 << 20


def geometry(tmp_path: Path, model: SyntheticModel) -> ModelGeometry:
    (path,) = write_header_only(tmp_path / f"{model.arch}.gguf", model)
    return geometry_from_header(read_header(path))


# ----------------------------------------------------------------------------------------- context layout


@pytest.mark.parametrize(
    ("ctx", "n_seq", "n_ctx", "n_ctx_seq"),
    [
        (1, 1, 256, 256),
        (1000, 1, 1024, 1024),
        (4096, 1, 4096, 4096),
        (4097, 1, 4352, 4352),
        (4096, 2, 4096, 2048),
        (4096, 3, 4608, 1536),  # 4096/3 = 1365 -> padded to 1536 per slot
        (1000, 4, 1024, 256),
        (256, 4, 1024, 256),  # every slot gets at least one 256-cell block
    ],
)
def test_context_padding(ctx: int, n_seq: int, n_ctx: int, n_ctx_seq: int) -> None:
    layout = context_layout(ctx, n_seq)
    assert (layout.n_ctx, layout.n_ctx_seq, layout.n_stream) == (n_ctx, n_ctx_seq, n_seq)
    assert layout.full_cells == n_ctx


def test_unified_cache_is_one_stream() -> None:
    layout = context_layout(4096, 3, unified=True, n_swa=1024, ubatch=512)
    assert (layout.n_stream, layout.n_ctx_seq, layout.full_cells) == (1, 4096, 4096)
    # one stream holding the windows of all 3 sequences: pad256(min(4096, 3*1024 + 512)) = 3584
    assert layout.swa_cells_total == 3584


@pytest.mark.parametrize("bad", [0, -5])
def test_context_must_be_positive(bad: int) -> None:
    with pytest.raises(FootprintError):
        context_layout(bad, 1)
    with pytest.raises(FootprintError):
        context_layout(256, bad)


# ----------------------------------------------------------------------------------------- KV per token

# Bytes per element, as DESIGN lists them (block types: bytes per 32-element block / 32).
BPE = {
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "iq4_nl": 18 / 32,
}


def test_every_cache_type_is_covered() -> None:
    assert set(BPE) == set(CACHE_TYPES)


@pytest.mark.parametrize("type_k", sorted(BPE))
@pytest.mark.parametrize("type_v", ["f16", "q4_0", "q8_0"])
def test_kv_bytes_per_cell_for_each_cache_type(tmp_path: Path, type_k: str, type_v: str) -> None:
    # 4 layers, 8 KV heads of 64 -> 512 elements per K row and per V row.
    g = geometry(tmp_path, SyntheticModel(n_embd=512, n_head=8, n_head_kv=8))
    per_layer = 512 * BPE[type_k] + 512 * BPE[type_v]
    assert kv_cell_bytes(g.layers[0], type_k, type_v) == per_layer
    fp = estimate(g, (0,), ctx=1024, cache_type_k=type_k, cache_type_v=type_v)
    (row,) = fp.devices
    assert row.kv_per_token == 4 * per_layer
    assert row.kv == 4 * per_layer * 1024


def test_unknown_cache_type(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel())
    with pytest.raises(FootprintError, match="unknown KV cache type 'q3_k'"):
        estimate(g, (0,), ctx=1024, cache_type_k="q3_k")


def test_per_layer_kv_head_counts_and_key_value_lengths(tmp_path: Path) -> None:
    model = SyntheticModel(
        n_layer=4,
        n_embd=512,
        n_head=8,
        n_head_kv=(8, 4, 2, 1),
        head_dim=128,
    )
    g = geometry(tmp_path, model)
    assert [layer.kv_heads for layer in g.layers] == [8, 4, 2, 1]
    assert {layer.head_k for layer in g.layers} == {128}  # key_length, not n_embd/n_head = 64
    (row,) = estimate(g, (0,), ctx=512).devices
    # f16 K and V: (8+4+2+1) heads * 128 * 2 bytes * 2 (K and V)
    assert row.kv_per_token == 15 * 128 * 2 * 2


def test_head_count_kv_defaults_to_head_count(tmp_path: Path) -> None:
    (path,) = write_header_only(tmp_path / "m.gguf", SyntheticModel(n_head=8, n_head_kv=8, n_embd=256))
    g = geometry_from_header(read_header(path))
    assert all(layer.kv_heads == 8 and layer.head_k == 32 for layer in g.layers)


def test_kv_scales_with_slots_only_through_padding(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(n_embd=256, n_head=8, n_head_kv=4))
    one = estimate(g, (0,), ctx=8192, n_seq=1).devices[0]
    four = estimate(g, (0,), ctx=8192, n_seq=4).devices[0]
    assert one.kv == four.kv  # 4 streams of 2048 cells hold as much as one of 8192
    three = estimate(g, (0,), ctx=8192, n_seq=3).devices[0]
    assert three.kv == one.kv_per_token * 3 * 2816  # 8192/3 = 2730 -> 2816 per slot


# ----------------------------------------------------------------------------------------- sliding window


def test_gemma3_default_pattern_and_window_cells(tmp_path: Path) -> None:
    model = SyntheticModel(
        arch="gemma3",
        n_layer=12,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        extra=((".attention.sliding_window", 1024),),
    )
    g = geometry(tmp_path, model)
    # Period 6: layers 5 and 11 are global, the rest slide.
    assert [i for i, layer in enumerate(g.layers) if not layer.sliding] == [5, 11]
    cell = 2 * 64 * 2 * 2  # 2 KV heads * 64 * f16 * (K+V)
    for ctx, n_seq, swa_cells in [(32768, 1, 1536), (1024, 1, 1024), (32768, 4, 1536), (4096, 4, 1024)]:
        fp = estimate(g, (0,), ctx=ctx, n_seq=n_seq, ubatch=512)
        (row,) = fp.devices
        layout = fp.layout
        # per stream: pad256(min(n_ctx_seq, 1024 + 512))
        assert layout.swa_cells == swa_cells
        assert row.kv_per_token == 2 * cell  # only the two global layers grow with the context
        assert row.kv == 2 * cell * layout.n_ctx + 10 * cell * swa_cells * n_seq


def test_integer_and_array_patterns(tmp_path: Path) -> None:
    by_int = geometry(
        tmp_path,
        SyntheticModel(
            arch="cohere2",
            n_layer=8,
            extra=((".attention.sliding_window", 512), (".attention.sliding_window_pattern", 3)),
        ),
    )
    assert [layer.sliding for layer in by_int.layers] == [True, True, False] * 2 + [True, True]
    flags = [True, False, False, True, True, False, True, True]
    by_array = geometry(
        tmp_path,
        SyntheticModel(
            arch="gemma4",
            n_layer=8,
            extra=((".attention.sliding_window", 512), (".attention.sliding_window_pattern", flags)),
        ),
    )
    assert [layer.sliding for layer in by_array.layers] == flags


def test_dense_first_pattern(tmp_path: Path) -> None:
    g = geometry(
        tmp_path,
        SyntheticModel(arch="smallthinker", n_layer=8, extra=((".attention.sliding_window", 4096),)),
    )
    assert [layer.sliding for layer in g.layers] == [False, True, True, True] * 2


def test_no_window_means_no_sliding(tmp_path: Path) -> None:
    g = geometry(
        tmp_path, SyntheticModel(arch="gemma3", n_layer=6, extra=((".attention.sliding_window", 0),))
    )
    assert not g.has_swa
    # A window on an architecture llama.cpp never slides is ignored.
    g = geometry(
        tmp_path, SyntheticModel(arch="llama", n_layer=6, extra=((".attention.sliding_window", 4096),))
    )
    assert not g.has_swa


def test_gemma2_default_window(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(arch="gemma2", n_layer=4))
    assert g.n_swa == 4096
    assert [layer.sliding for layer in g.layers] == [True, False, True, False]


def test_sliding_head_sizes(tmp_path: Path) -> None:
    g = geometry(
        tmp_path,
        SyntheticModel(
            arch="gemma3",
            n_layer=6,
            n_embd=256,
            n_head=4,
            n_head_kv=2,
            head_dim=128,
            extra=(
                (".attention.sliding_window", 512),
                (".attention.key_length_swa", 64),
                (".attention.value_length_swa", 64),
            ),
        ),
    )
    assert [(layer.head_k, layer.head_v) for layer in g.layers] == [(64, 64)] * 5 + [(128, 128)]


# ----------------------------------------------------------------------------------------- recurrent layers

QWEN_NEXT_SSM = (
    (".ssm.conv_kernel", 4),
    (".ssm.inner_size", 1024),
    (".ssm.state_size", 64),
    (".ssm.group_count", 4),
    (".ssm.time_step_rank", 8),
)


def test_qwen3next_hybrid_layout(tmp_path: Path) -> None:
    model = SyntheticModel(
        arch="qwen3next",
        n_layer=8,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        extra=((".full_attention_interval", 4), *QWEN_NEXT_SSM),
    )
    g = geometry(tmp_path, model)
    attention = [i for i, layer in enumerate(g.layers) if layer.kv_heads]
    recurrent = [i for i, layer in enumerate(g.layers) if layer.recurrent_floats]
    assert attention == [3, 7]  # layer i is recurrent unless (i+1) % 4 == 0
    assert recurrent == [0, 1, 2, 4, 5, 6]
    # conv: (4-1) * (1024 + 2*4*64) = 4608; state: 64 * 1024 = 65536 floats per sequence
    floats = 3 * (1024 + 2 * 4 * 64) + 64 * 1024
    assert g.layers[0].recurrent_floats == floats
    for n_seq in (1, 3):
        small = estimate(g, (0,), ctx=1024 * n_seq, n_seq=n_seq).devices[0]
        large = estimate(g, (0,), ctx=8192 * n_seq, n_seq=n_seq).devices[0]
        assert small.recurrent == large.recurrent == 6 * floats * 4 * n_seq
        assert small.kv_per_token == 2 * (2 * 64 * 2 * 2)


def test_qwen3next_interval_defaults_to_4(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(arch="qwen3next", n_layer=8, extra=QWEN_NEXT_SSM))
    assert [i for i, layer in enumerate(g.layers) if layer.kv_heads] == [3, 7]


def test_mamba_is_all_state(tmp_path: Path) -> None:
    model = SyntheticModel(
        arch="mamba",
        n_layer=4,
        n_embd=256,
        n_head=0,
        n_head_kv=0,
        extra=((".ssm.conv_kernel", 4), (".ssm.inner_size", 512), (".ssm.state_size", 16)),
    )
    g = geometry(tmp_path, model)
    fp = estimate(g, (0,), ctx=4096, n_seq=2)
    (row,) = fp.devices
    assert row.kv == 0 and row.kv_per_token == 0
    assert row.recurrent == 4 * (3 * 512 + 16 * 512) * 4 * 2


def test_zero_kv_heads_mark_recurrent_layers_in_jamba(tmp_path: Path) -> None:
    model = SyntheticModel(
        arch="jamba",
        n_layer=4,
        n_embd=256,
        n_head=8,
        n_head_kv=(0, 0, 4, 0),
        extra=((".ssm.conv_kernel", 4), (".ssm.inner_size", 512), (".ssm.state_size", 16)),
    )
    g = geometry(tmp_path, model)
    assert [bool(layer.recurrent_floats) for layer in g.layers] == [True, True, False, True]
    assert [layer.kv_heads for layer in g.layers] == [0, 0, 4, 0]


def test_explicit_recurrent_layer_array(tmp_path: Path) -> None:
    flags = [True, False, True, True]
    g = geometry(
        tmp_path,
        SyntheticModel(
            arch="qwen35", n_layer=4, extra=((".attention.recurrent_layers", flags), *QWEN_NEXT_SSM)
        ),
    )
    assert [bool(layer.recurrent_floats) for layer in g.layers] == flags


# ----------------------------------------------------------------------------------------- weights placement


def test_weights_token_embd_on_cpu_output_with_last_layer(tmp_path: Path) -> None:
    model = SyntheticModel(n_layer=4, n_embd=256, n_vocab=1000, n_ff=512, weight_type="f16")
    g = geometry(tmp_path, model)
    header = read_header(tmp_path / "llama.gguf")
    tensor = {t.name: t.n_bytes for t in header.tensors}
    layer = sum(n for name, n in tensor.items() if name.startswith("blk.0."))
    fp = estimate(g, (0, 1), ctx=1024, shares=[1, 1])
    first, second = fp.devices
    # 5 slots (4 blocks + output), x = i/5: blocks 0-2 (x = 0, 0.2, 0.4 < 0.5) on GPU 0, the rest on GPU 1
    assert (first.layers, second.layers) == (3, 1)
    assert first.weights == 3 * layer
    assert second.weights == layer + tensor["output.weight"] + tensor["output_norm.weight"]
    assert fp.host_weights == tensor["token_embd.weight"] == 1000 * 256 * 2
    assert fp.gpu_layers == 5


def test_tied_output_duplicates_token_embd_on_the_last_gpu(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(n_layer=2, n_vocab=1000, n_embd=256, tied_output=True))
    embd = 1000 * 256 * 2
    assert g.tied_weights == embd
    fp = estimate(g, (0,), ctx=1024)
    (row,) = fp.devices
    assert row.weights == sum(g.layer_weights) + 256 * 4 + embd
    assert fp.host_weights == embd  # the input copy stays on the CPU as well
    # On the CPU alone the output uses the input's copy: the file's bytes, once.
    (cpu,) = estimate(g, (CPU,), ctx=1024).devices
    assert cpu.weights == g.file_weights


def test_cpu_only_counts_everything_once(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(n_layer=2, n_vocab=1000, n_embd=256))
    fp = estimate(g, (CPU,), ctx=1024)
    (row,) = fp.devices
    assert fp.gpu_layers == 0 and fp.host_weights == 0
    assert row.device == CPU and row.weights == g.file_weights


def test_partial_offload(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(n_layer=4))
    fp = estimate(g, (0,), ctx=1024, gpu_layers=2)
    (row,) = fp.devices
    # -ngl 2 of 5: layer 3 and the output layer on the GPU, layers 0-2 on the CPU.
    assert row.layers == 1
    assert row.weights == g.layer_weights[3] + g.output_weights
    assert fp.host_weights == g.input_weights + sum(g.layer_weights[:3])
    assert row.kv_per_token == kv_cell_bytes(g.layers[3], "f16", "f16")


@pytest.mark.parametrize(
    ("n_layer", "shares", "expected"),
    [
        # x = i / (n_layer + 1); device = first whose cumulative share exceeds x
        (4, [1, 1], [0, 0, 0, 1, 1]),
        (7, [3, 1], [0, 0, 0, 0, 0, 0, 1, 1]),
        (7, [1, 3], [0, 0, 1, 1, 1, 1, 1, 1]),
        (5, [1, 1, 1], [0, 0, 1, 1, 2, 2]),
        (3, [1], [0, 0, 0, 0]),
    ],
)
def test_layer_split_in_proportion(n_layer: int, shares: list[float], expected: list[int]) -> None:
    assert list(assign_layers(n_layer, n_layer + 1, shares)) == expected


def test_split_follows_budgets(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(n_layer=31))
    fp = estimate(g, (0, 1), ctx=2048, shares=[24, 8])
    a, b = fp.devices
    assert (a.layers, b.layers) == (24, 7)  # 32 slots (31 blocks + output) split 3:1
    assert b.weights > 7 * g.layer_weights[0]  # the output layer rides with the last GPU


def test_missing_block_count(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "nokeys.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with pytest.raises(FootprintError, match=r"llama\.block_count"):
        geometry_from_header(read_header(path))


# ----------------------------------------------------------------------------------------- compute buffer


def test_compute_grows_with_context_without_flash_attention(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel(n_layer=2, n_embd=256, n_head=8))
    fa_small = estimate(g, (0,), ctx=2048).devices[0].compute
    fa_large = estimate(g, (0,), ctx=8192).devices[0].compute
    no_fa = estimate(g, (0,), ctx=8192, flash_attn=False).devices[0].compute
    assert fa_small < fa_large < no_fa
    # without flash attention the score matrix alone is n_kv * ubatch * n_head f32
    assert no_fa - fa_large >= 8192 * 512 * 8 * 4


def test_reserve_is_added_per_device(tmp_path: Path) -> None:
    g = geometry(tmp_path, SyntheticModel())
    rows = estimate(g, (0, 1), ctx=1024, reserve=300 * MiB).devices
    for row in rows:
        assert row.reserve == 300 * MiB
        assert row.total == row.weights + row.kv + row.recurrent + row.compute + 300 * MiB
