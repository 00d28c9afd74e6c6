"""KV cache arithmetic: how llama.cpp lays out a context over its slots, and what one cell costs.

The rules follow llama.cpp (release 11434); ``router.placement.footprint`` multiplies them out per device.

KV cache
    The context is padded up to a multiple of 256. With ``-np P`` slots and the default non-unified cache
    there are P streams of ``n_ctx_seq = pad256(n_ctx / P)`` cells each. A full-attention layer stores, per
    cell, ``row(type_k, kv_heads*head_k) + row(type_v, kv_heads*head_v)`` bytes, ``row`` being the ggml row
    size (for the block-quantised types: elements/32 blocks of 34 (q8_0), 18 (q4_0, iq4_nl), 20 (q4_1),
    22 (q5_0) or 24 (q5_1) bytes; f32 4, f16 and bf16 2 bytes an element). A sliding-window layer holds only
    ``pad256(min(n_ctx_seq, n_swa + n_ubatch))`` cells per stream (unified cache: one stream of
    ``pad256(min(n_ctx, n_swa*P + n_ubatch))``). Which layers slide, and which hold no cache at all, is
    the model's geometry (``router.placement.geometry``).

Micro-batch (``-ub``, ``-b``)
    ``n_ubatch`` (default 512) is clamped to ``n_batch`` (default 2048) and to the context; it sets the
    ``+ n_ubatch`` term of the sliding-window cells above and the token count of the compute buffer.

Full-size sliding-window cache (``--swa-full``)
    Sliding-window layers then hold as many cells as full-attention layers (llama.cpp sets the SWA cache
    size to the base size), so ``swa_cells = n_ctx_seq``.
"""

from __future__ import annotations

import attrs

from router.placement.geometry import FootprintError, LayerGeometry
from router.placement.gguf_header import ggml_type_size

__all__ = [
    "CACHE_TYPES",
    "DEFAULT_UBATCH",
    "ContextLayout",
    "context_layout",
    "kv_cell_bytes",
    "pad256",
]

DEFAULT_UBATCH = 512

# Cache type names accepted by --cache-type-k / --cache-type-v -> ggml type ids (gguf.GGMLQuantizationType).
CACHE_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "iq4_nl": 20,
}


def pad256(n: int) -> int:
    """n rounded up to a multiple of 256 (llama.cpp pads context sizes this way)."""
    return -(-n // 256) * 256


def _row_bytes(ggml_type: int, n: int) -> int:
    block, size = ggml_type_size(ggml_type)
    if n % block:
        raise FootprintError(
            f"a KV row of {n} elements is not a multiple of the cache type's block of {block}"
        )
    return n // block * size


def _cache_type(name: str) -> int:
    try:
        return CACHE_TYPES[name.lower()]
    except KeyError:
        raise FootprintError(f"unknown KV cache type {name!r} (known: {', '.join(CACHE_TYPES)})") from None


def kv_cell_bytes(layer: LayerGeometry, cache_type_k: str, cache_type_v: str) -> int:
    """Bytes one KV cell (one token of one stream) costs in one layer."""
    if layer.kv_heads == 0:
        return 0
    return _row_bytes(_cache_type(cache_type_k), layer.kv_heads * layer.head_k) + _row_bytes(
        _cache_type(cache_type_v), layer.kv_heads * layer.head_v
    )


@attrs.frozen
class ContextLayout:
    """How llama.cpp lays out a context of ``requested`` tokens over ``n_seq`` slots.

    ``n_ctx`` is the context it really allocates (padded), ``n_ctx_seq`` the cells per stream (what each slot
    can hold), ``n_stream`` the number of separate KV streams (``n_seq`` for the default non-unified cache,
    1 for ``--kv-unified``), ``swa_cells`` the cells per stream of a sliding-window layer.
    """

    requested: int
    n_seq: int
    n_stream: int
    n_ctx: int
    n_ctx_seq: int
    swa_cells: int

    @property
    def full_cells(self) -> int:
        """Cells of a full-attention layer over all streams."""
        return self.n_ctx_seq * self.n_stream

    @property
    def swa_cells_total(self) -> int:
        return self.swa_cells * self.n_stream


def context_layout(
    ctx: int,
    n_seq: int,
    *,
    n_swa: int = 0,
    ubatch: int = DEFAULT_UBATCH,
    unified: bool = False,
    swa_full: bool = False,
) -> ContextLayout:
    """llama.cpp's context arithmetic: ``-c ctx -np n_seq`` -> cells per stream (see ContextLayout).

    Sliding-window cells per stream: ``pad256(min(n_ctx_seq, n_swa * (n_seq if unified else 1) +
    ubatch))``, or ``n_ctx_seq`` with ``swa_full``.
    """
    if ctx <= 0:
        raise FootprintError(f"context must be positive, got {ctx}")
    if n_seq <= 0:
        raise FootprintError(f"the slot count must be positive, got {n_seq}")
    n_ctx = pad256(ctx)
    if unified:
        n_stream, n_ctx_seq = 1, n_ctx
        swa = pad256(min(n_ctx, n_swa * n_seq + ubatch)) if n_swa > 0 else 0
    else:
        n_stream = n_seq
        n_ctx_seq = pad256(n_ctx // n_seq)
        n_ctx = n_ctx_seq * n_seq
        swa = pad256(min(n_ctx_seq, n_swa + ubatch)) if n_swa > 0 else 0
    if swa_full and n_swa > 0:
        swa = n_ctx_seq
    return ContextLayout(
        requested=ctx, n_seq=n_seq, n_stream=n_stream, n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, swa_cells=swa
    )
