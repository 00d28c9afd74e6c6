"""Tiny random-weight llama models written as GGUF files.

The models have a real tokenizer (copied from one of llama.cpp's ``ggml-vocab-<name>.gguf`` files) and
seeded random weights, so llama-server loads them, tokenizes real text and generates fast on a CPU. The
text they produce is gibberish; greedy decoding of the same prompt gives the same tokens.

Run as ``python -m router make-model OUT [options]`` or call :func:`write_tiny_model`.
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, LlamaFileType, quants

from router.hosts.locate import vocab_dir as default_vocab_dir

ARCH = "llama"

_TENSOR_TYPES: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
}
_FILE_TYPES: dict[str, LlamaFileType] = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
    "q4_0": LlamaFileType.MOSTLY_Q4_0,
}
DTYPES: tuple[str, ...] = tuple(_TENSOR_TYPES)


class VocabNotFound(FileNotFoundError):
    """The requested ``ggml-vocab-<name>.gguf`` file is not in the vocab directory."""


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class TinyShape:
    """Hyper-parameters of a tiny llama model.

    ``vocab`` names a tokenizer file ``ggml-vocab-<vocab>.gguf``; its token count sets the vocab size.
    ``dtype`` is the type of the 2-D weight matrices; norm vectors are always f32.
    ``tie_output`` leaves out ``output.weight`` so llama.cpp reuses ``token_embd.weight`` for the logits.
    """

    n_embd: int = attrs.field(default=64, validator=_positive)
    n_layer: int = attrs.field(default=2, validator=_positive)
    n_head: int = attrs.field(default=4, validator=_positive)
    n_head_kv: int = attrs.field(default=2, validator=_positive)
    n_ff: int = attrs.field(default=128, validator=_positive)
    n_ctx_train: int = attrs.field(default=2048, validator=_positive)
    dtype: str = attrs.field(default="f32", validator=attrs.validators.in_(DTYPES))
    vocab: str = "llama-spm"
    seed: int = 0
    tie_output: bool = False

    def __attrs_post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2:
            raise ValueError(
                f"the head size n_embd/n_head ({self.head_dim}) must be even for rotary embedding"
            )
        block = gguf.GGML_QUANT_SIZES[_TENSOR_TYPES[self.dtype]][0]
        for name in ("n_embd", "n_ff"):
            if getattr(self, name) % block:
                raise ValueError(f"{name} must be a multiple of {block} for dtype {self.dtype}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        """Width of the K (and V) projection: n_head_kv * head_dim."""
        return self.n_head_kv * self.head_dim

    @property
    def tensor_type(self) -> GGMLQuantizationType:
        return _TENSOR_TYPES[self.dtype]


def vocab_file(vocab_dir: Path, name: str) -> Path:
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        available = sorted(
            p.name.removeprefix("ggml-vocab-").removesuffix(".gguf") for p in vocab_dir.glob("*.gguf")
        )
        hint = f"available: {', '.join(available)}" if available else "the directory holds no vocab files"
        raise VocabNotFound(f"no tokenizer file {path} ({hint}); scripts/install-llama-server installs them")
    return path


# struct format of one GGUF scalar, by value type.
_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


def _unpack(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError(f"{f.name}: truncated GGUF header")
    return struct.unpack("<" + fmt, data)[0] if len(fmt) == 1 else struct.unpack("<" + fmt, data)


def _value(f: BinaryIO, vtype: GGUFValueType) -> Any:
    """One value of a GGUF key, strings kept as raw bytes, arrays as lists."""
    if vtype in _SCALARS:
        return _unpack(f, _SCALARS[vtype])
    if vtype == GGUFValueType.STRING:
        return f.read(_unpack(f, "Q"))
    if vtype == GGUFValueType.ARRAY:
        return _array(f, GGUFValueType(_unpack(f, "I")))
    raise ValueError(f"{f.name}: unknown GGUF value type {vtype}")


def _array(f: BinaryIO, item: GGUFValueType) -> list[Any]:
    """The elements of an array whose item type was just read."""
    n = _unpack(f, "Q")
    if item in _SCALARS:
        return list(_unpack(f, f"{n}{_SCALARS[item]}")) if n else []
    return [_value(f, item) for _ in range(n)]


def _tokenizer_keys(vocab_path: Path) -> Iterator[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """(key, value, type, array item type) of every ``tokenizer.*`` key of a vocab file, in file order.

    Read with a plain sequential parse rather than ``gguf.GGUFReader``, which keeps a numpy view per array
    element: ~90 MB for a 32k-token vocabulary where these lists take a few.
    """
    with open(vocab_path, "rb") as f:
        if f.read(4) != b"GGUF" or _unpack(f, "I") not in (2, 3):
            raise ValueError(f"{vocab_path}: not a little-endian GGUF file of version 2 or 3")
        _unpack(f, "Q")  # tensor count
        for _ in range(_unpack(f, "Q")):
            key = f.read(_unpack(f, "Q")).decode("utf-8")
            vtype = GGUFValueType(_unpack(f, "I"))
            sub_type = GGUFValueType(_unpack(f, "I")) if vtype == GGUFValueType.ARRAY else None
            value = _value(f, vtype) if sub_type is None else _array(f, sub_type)
            if key.startswith("tokenizer."):
                yield key, value, vtype, sub_type


def _copy_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path) -> int:
    """Copy every ``tokenizer.*`` key of a vocab file; return the number of tokens."""
    n_vocab = 0
    for key, value, vtype, sub_type in _tokenizer_keys(vocab_path):
        writer.add_key_value(key, value, vtype, sub_type)
        if key == gguf.Keys.Tokenizer.LIST:
            n_vocab = len(value)
    if n_vocab == 0:
        raise ValueError(f"{vocab_path} has no {gguf.Keys.Tokenizer.LIST} array")
    return n_vocab


def _tensor_name(kind: gguf.MODEL_TENSOR, layer: int | None = None) -> str:
    template = gguf.TENSOR_NAMES[kind]
    name = template.format(bid=layer) if layer is not None else template
    return f"{name}.weight"


# One tensor of the model: name, numpy shape (rows, cols), ggml type, and the scale of its random values
# (None: a norm vector, all ones, always f32).
_Tensor = tuple[str, tuple[int, ...], GGMLQuantizationType, float | None]


def _tensor_plan(shape: TinyShape, n_vocab: int) -> list[_Tensor]:
    """Every tensor of the model, in file order."""
    t = gguf.MODEL_TENSOR
    e, kv, ff = shape.n_embd, shape.n_embd_kv, shape.n_ff
    w = shape.tensor_type

    def norm(name: str) -> _Tensor:
        return name, (e,), GGMLQuantizationType.F32, None

    # Unit-scale embeddings; projections scaled by fan-in so activations stay near unit size; a large
    # output scale makes the logits peaked, which keeps greedy decoding stable across batch sizes.
    plan: list[_Tensor] = [(_tensor_name(t.TOKEN_EMBD), (n_vocab, e), w, 1.0)]
    for i in range(shape.n_layer):
        plan += [
            norm(_tensor_name(t.ATTN_NORM, i)),
            (_tensor_name(t.ATTN_Q, i), (e, e), w, 0.5 / e**0.5),
            (_tensor_name(t.ATTN_K, i), (kv, e), w, 0.5 / e**0.5),
            (_tensor_name(t.ATTN_V, i), (kv, e), w, 0.5 / e**0.5),
            (_tensor_name(t.ATTN_OUT, i), (e, e), w, 0.5 / e**0.5),
            norm(_tensor_name(t.FFN_NORM, i)),
            (_tensor_name(t.FFN_GATE, i), (ff, e), w, 0.5 / e**0.5),
            (_tensor_name(t.FFN_UP, i), (ff, e), w, 0.5 / e**0.5),
            (_tensor_name(t.FFN_DOWN, i), (e, ff), w, 0.5 / ff**0.5),
        ]
    plan.append(norm(_tensor_name(t.OUTPUT_NORM)))
    if not shape.tie_output:
        plan.append((_tensor_name(t.OUTPUT), (n_vocab, e), w, 4.0 / e**0.5))
    return plan


def _data(rng: np.random.Generator, tensor: _Tensor) -> np.ndarray:
    """A tensor's data as the file holds it. The random values are drawn tensor after tensor in file order,
    so a seed gives the same file."""
    _, dims, qtype, scale = tensor
    if scale is None:
        values = np.ones(dims, dtype=np.float32)
    else:
        values = rng.standard_normal(dims, dtype=np.float32)
        values *= np.float32(scale)
    if qtype == GGMLQuantizationType.F32:
        return values
    if qtype == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return quants.quantize(values, qtype)


def write_tiny_model(path: Path, shape: TinyShape, vocab_dir: Path | None = None) -> Path:
    """Write a random-weight llama GGUF model of ``shape`` to ``path`` and return ``path``.

    ``vocab_dir`` holds the ``ggml-vocab-*.gguf`` files; by default the directory filled by
    ``scripts/install-llama-server``. The file appears atomically (written aside, then renamed).
    """
    if vocab_dir is None:
        vocab_dir = default_vocab_dir()
    vocab_path = vocab_file(vocab_dir, shape.vocab)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(f"tiny-{ARCH}-{shape.n_embd}x{shape.n_layer}-{shape.dtype}")
        writer.add_context_length(shape.n_ctx_train)
        writer.add_embedding_length(shape.n_embd)
        writer.add_block_count(shape.n_layer)
        writer.add_feed_forward_length(shape.n_ff)
        writer.add_head_count(shape.n_head)
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_dimension_count(shape.head_dim)
        writer.add_rope_freq_base(10000.0)
        writer.add_file_type(_FILE_TYPES[shape.dtype])
        n_vocab = _copy_tokenizer(writer, vocab_path)
        writer.add_vocab_size(n_vocab)
        # Tensor infos first, then the data one tensor at a time: only one tensor is ever in memory.
        plan = _tensor_plan(shape, n_vocab)
        for name, dims, qtype, _ in plan:
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            # The shape in elements; raw_dtype names the ggml type of the data written below.
            n_bytes = math.prod(dims) // block * type_size
            writer.add_tensor_info(name, dims, np.dtype(np.float32), n_bytes, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(shape.seed)
        for tensor in plan:
            writer.write_tensor_data(_data(rng, tensor))
        writer.close()
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def build_parser() -> argparse.ArgumentParser:
    defaults = TinyShape()
    parser = argparse.ArgumentParser(
        prog="llama-router make-model",
        description="Write a tiny random-weight llama GGUF model (real tokenizer, gibberish output).",
    )
    parser.add_argument("out", type=Path, metavar="OUT", help="path of the .gguf file to write")
    parser.add_argument("--embd", type=int, default=defaults.n_embd, help="embedding width")
    parser.add_argument("--layers", type=int, default=defaults.n_layer, help="number of blocks")
    parser.add_argument("--heads", type=int, default=defaults.n_head, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=defaults.n_head_kv, help="key/value heads")
    parser.add_argument("--ff", type=int, default=defaults.n_ff, help="feed-forward width")
    parser.add_argument("--ctx-train", type=int, default=defaults.n_ctx_train, help="training context length")
    parser.add_argument("--dtype", choices=DTYPES, default=defaults.dtype, help="type of the weight matrices")
    parser.add_argument(
        "--vocab", default=defaults.vocab, help="tokenizer: NAME of a ggml-vocab-NAME.gguf file"
    )
    parser.add_argument("--vocab-dir", type=Path, default=None, help="directory of the vocab files")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed of the weights")
    parser.add_argument("--tie-output", action="store_true", help="reuse token_embd for the output layer")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        shape = TinyShape(
            n_embd=args.embd,
            n_layer=args.layers,
            n_head=args.heads,
            n_head_kv=args.kv_heads,
            n_ff=args.ff,
            n_ctx_train=args.ctx_train,
            dtype=args.dtype,
            vocab=args.vocab,
            seed=args.seed,
            tie_output=args.tie_output,
        )
        path = write_tiny_model(args.out, shape, args.vocab_dir)
    except (ValueError, VocabNotFound) as exc:
        parser.error(str(exc))
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
