"""The models under test: real layer shapes (or tiny ones for a quick check) and their model files."""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from router.cli.tinymodel import TinyShape, write_tiny_model


@attrs.frozen
class Subject:
    """One model under test: its router name, its shape and its extra config keys (``ctx``, ``parallel``)."""

    name: str
    shape: TinyShape
    table: Mapping[str, Any]


# Real layer shapes and vocabularies; weights random. "qwen": Qwen2.5-0.5B (tied output, as the real one);
# "llama": Llama-3.2-1B with its own output layer (the real one ties it), so both layouts are measured.
REAL_SUBJECTS = (
    Subject(
        "qwen-shape",
        TinyShape(
            n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864, n_ctx_train=32768,
            dtype="f16", vocab="qwen2", tie_output=True,
        ),
        {"parallel": 2},
    ),
    Subject(
        "llama-shape",
        TinyShape(
            n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, n_ctx_train=131072,
            dtype="q8_0", vocab="llama-bpe",
        ),
        {"ctx": 16384},
    ),
)  # fmt: skip
# The same layouts, tiny: a quick check of the script itself (--small-models).
SMALL_SUBJECTS = (
    Subject(
        "qwen-shape",
        TinyShape(
            n_embd=128, n_layer=3, n_head=4, n_head_kv=2, n_ff=384, n_ctx_train=4096,
            dtype="f16", tie_output=True,
        ),
        {"parallel": 2},
    ),
    Subject(
        "llama-shape",
        TinyShape(n_embd=256, n_layer=2, n_head=8, n_head_kv=2, n_ff=768, n_ctx_train=8192, dtype="q8_0"),
        {"ctx": 4096},
    ),
)  # fmt: skip


def model_files(directory: Path, subjects: Sequence[Subject]) -> dict[str, Path]:
    """Each subject's model file, written once per shape (the name carries a digest of the shape)."""
    paths = {}
    for subject in subjects:
        digest = hashlib.sha256(repr(attrs.astuple(subject.shape)).encode()).hexdigest()[:12]
        path = directory / f"{subject.name}-{digest}.gguf"
        if not path.is_file():
            started = time.monotonic()
            write_tiny_model(path, subject.shape)
            print(f"wrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        paths[subject.name] = path
    return paths
