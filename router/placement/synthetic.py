"""Header-only GGUF files of a chosen geometry, for tests and benchmarks of the placement arithmetic.

:func:`write_header_only` writes the metadata and the tensor infos of a llama-like model (any
architecture name, per-layer KV head counts, tied or separate output, extra keys for sliding windows or
recurrent layers) and no tensor data: the file is as small as its header, and its tensor sizes are
exactly what a real model of that shape declares. Such files are for the header reader only; llama.cpp
cannot load them. Needs numpy and the ``gguf`` package (imported lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["SyntheticModel", "write_header_only"]


def _tuple(value: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(value)


@attrs.frozen
class SyntheticModel:
    """Shape of a synthetic model.

    ``n_head_kv`` is one count for every layer or one per layer (0 = no attention in that layer, as the
    hybrids write it). ``weight_type`` names a ggml type (``f16``, ``q4_k``, ...) for the 2-D weights;
    norms are f32. ``extra`` holds more metadata: ``(key, value)`` where a key starting with ``.`` is
    appended to the architecture name (``(".attention.sliding_window", 1024)``); ints are written as
    uint32, floats as float32, sequences as arrays. ``ssm`` adds Mamba-style tensors to recurrent layers
    (layers whose KV head count is 0), so their weights are not empty.
    """

    arch: str = "llama"
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 8
    n_head_kv: int | tuple[int, ...] = 4
    n_ff: int = 512
    n_vocab: int = 1024
    n_ctx_train: int = 8192
    weight_type: str = "f16"
    tied_output: bool = False
    head_dim: int | None = None
    extra: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_tuple)

    def kv_heads(self) -> tuple[int, ...]:
        if isinstance(self.n_head_kv, int):
            return (self.n_head_kv,) * self.n_layer
        return tuple(self.n_head_kv)

    @property
    def head_size(self) -> int:
        if self.head_dim is not None:
            return self.head_dim
        return self.n_embd // self.n_head if self.n_head else 0


def write_header_only(path: str | Path, model: SyntheticModel, *, split_max_tensors: int = 0) -> list[Path]:
    """Write ``model``'s header (no tensor data) to ``path``; returns the files written (several when
    ``split_max_tensors`` splits the model into ``NAME-0000i-of-0000N.gguf`` shards)."""
    import gguf
    import numpy as np

    path = Path(path)
    qtype = gguf.GGMLQuantizationType[model.weight_type.upper()]
    f32 = gguf.GGMLQuantizationType.F32
    w = gguf.GGUFWriter(path, model.arch, split_max_tensors=split_max_tensors)
    a = model.arch
    w.add_uint32(f"{a}.block_count", model.n_layer)
    w.add_uint32(f"{a}.context_length", model.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", model.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", model.n_ff)
    w.add_uint32(f"{a}.attention.head_count", model.n_head)
    if isinstance(model.n_head_kv, int):
        w.add_uint32(f"{a}.attention.head_count_kv", model.n_head_kv)
    else:
        w.add_array(f"{a}.attention.head_count_kv", [int(v) for v in model.n_head_kv])
    if model.head_dim is not None:
        w.add_uint32(f"{a}.attention.key_length", model.head_dim)
        w.add_uint32(f"{a}.attention.value_length", model.head_dim)
    w.add_uint32(f"{a}.vocab_size", model.n_vocab)
    for key, value in model.extra:
        full = f"{a}{key}" if key.startswith(".") else key
        if isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            w.add_array(full, list(value))

    def tensor(name: str, shape: tuple[int, ...], t: Any = qtype) -> None:
        block, size = gguf.GGML_QUANT_SIZES[t]
        n = int(np.prod(shape))
        # numpy order (rows first), as GGUFWriter expects; it writes ggml order (ne[0] first).
        w.add_tensor_info(name, shape, np.dtype(np.float32), n // block * size, raw_dtype=t)

    e, hd = model.n_embd, model.head_size
    tensor("token_embd.weight", (model.n_vocab, e))
    for i, kvh in enumerate(model.kv_heads()):
        tensor(f"blk.{i}.attn_norm.weight", (e,), f32)
        if kvh > 0:
            tensor(f"blk.{i}.attn_q.weight", (model.n_head * hd, e))
            tensor(f"blk.{i}.attn_k.weight", (kvh * hd, e))
            tensor(f"blk.{i}.attn_v.weight", (kvh * hd, e))
            tensor(f"blk.{i}.attn_output.weight", (e, model.n_head * hd))
        else:
            tensor(f"blk.{i}.ssm_in.weight", (2 * e, e))
            tensor(f"blk.{i}.ssm_out.weight", (e, e))
        tensor(f"blk.{i}.ffn_norm.weight", (e,), f32)
        tensor(f"blk.{i}.ffn_gate.weight", (model.n_ff, e))
        tensor(f"blk.{i}.ffn_up.weight", (model.n_ff, e))
        tensor(f"blk.{i}.ffn_down.weight", (e, model.n_ff))
    tensor("output_norm.weight", (e,), f32)
    if not model.tied_output:
        tensor("output.weight", (model.n_vocab, e))
    paths = [Path(p) for p in w.format_shard_names(path)]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return paths
