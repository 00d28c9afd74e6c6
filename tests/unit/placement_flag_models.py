"""Header-only models and a placement shortcut shared by the tests of llama-server flags that move memory.

Expected byte counts in those tests are worked out by hand from llama.cpp's rules (router/placement/
kv_layout.py, router/placement/footprint.py, router/placement/extras.py, router/deploy/memory_flags.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.placement.fit import plan_model
from router.placement.model_plan import ModelPlan, PlacementInput
from router.placement.synthetic import SyntheticModel, write_header_only

MiB = 1 << 20
GiB = 1 << 30
ROOMY = {0: 64 * GiB, 1: 64 * GiB}

# gemma3: layer i slides unless i % 6 == 5, so 20 of 24 layers slide (window 1024). 32 KV heads of 128:
# one cell of one layer is 32*128*2 bytes of K plus as much V = 16384 bytes.
GEMMA3_SWA = SyntheticModel(
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
GEMMA3_CELL = 16384


def header_only(tmp_path: Path, model: SyntheticModel, name: str) -> Path:
    (path,) = write_header_only(tmp_path / f"{name}.gguf", model)
    return path


def write_gguf(
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


def projector_gguf(tmp_path: Path, keys: dict[str, Any] = GEMMA3_VISION) -> Path:
    tensors = [
        ("v.patch_embd.weight", (256, 588), "f16"),
        ("v.blk.0.ffn_up.weight", (512, 256), "f16"),
        ("mm.0.weight", (256, 256), "f16"),
    ]
    return write_gguf(tmp_path / "mmproj.gguf", "clip", keys, tensors)


def plan_of(path: Path, devices: dict[Any, int | None] = ROOMY, **kw: Any) -> ModelPlan:
    plan = plan_model(PlacementInput("m", path, **kw), devices)
    assert plan.verdict not in ("error", "refused"), plan.message
    return plan


# Draft: 2 layers of n_embd 128, 4 heads of 32, 2 KV heads; a layer is 295936 bytes of weights, the output
# layer 262656; one cell of one layer 2*32*2 (K) + 2*32*2 (V) = 256 bytes.
DRAFT = SyntheticModel(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=1024)
DRAFT_GPU_WEIGHTS = 2 * 295936 + 262656
