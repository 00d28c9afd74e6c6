"""Model geometry: what the memory arithmetic needs from a GGUF header, per layer.

:func:`geometry_from_header` reads the hyper-parameters, which layers keep a KV cache (full attention or
sliding window) or a recurrent state, and the bytes of each layer's weights. The rules follow llama.cpp
(release 11434); ``router.placement.footprint`` turns a geometry into per-device bytes.

Weights
    ``blk.N.*`` tensors go with layer N's device. ``token_embd`` (and the other input tensors:
    ``position_embd``, ``token_types``, ``per_layer_token_embd``) always stay on the CPU. Every other tensor
    (``output_norm``, ``output``, classifier heads, ...) belongs to the output layer, which sits on the
    device of the last layer. When ``output.weight`` is absent the model reuses ``token_embd`` for the
    logits and llama.cpp loads a second copy of it with the output layer.

Sliding-window layers
    Which layers slide: a ``sliding_window_pattern`` array (true = sliding), else an integer period N
    (llama.cpp: layer i slides unless ``i % N == N-1``; a few architectures count the dense layer first:
    unless ``i % N == 0``), else the architecture's built-in period (gemma2 2, gemma3 6, cohere2 4, gpt-oss
    2, llama4 4, ...). No sliding at all when the window is 0. Layers that share another layer's cache
    (gemma3n, ``attention.shared_kv_layers``) hold none.

Recurrent state
    A recurrent layer keeps a fixed f32 state per sequence (``max(1, P)`` of them), whatever the context:
    ``(conv_kernel-1) * (inner_size + 2*group_count*state_size) + state_size*inner_size`` floats (Mamba,
    Mamba-2, gated delta net), ``token_shift_count*n_embd + n_embd*wkv_head_size`` (RWKV),
    ``n_embd*(l_cache-1)`` (LFM2 short convolutions). Which layers are recurrent: an
    ``attention.recurrent_layers`` array; else, Qwen3-next style, every layer except each
    ``full_attention_interval``-th (layer i is recurrent unless ``(i+1) % interval == 0``); else for
    Jamba/Granite-hybrid/Nemotron-H/PLaMo-2/LFM2 the layers whose ``head_count_kv`` is 0; every layer for
    Mamba, RWKV and Falcon-H1 (which also keeps attention in every layer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs

from router.placement.gguf_header import GGUFHeader

__all__ = [
    "FootprintError",
    "LayerGeometry",
    "ModelGeometry",
    "geometry_from_header",
    "tensor_layer",
]

# Architectures whose sliding-window layers follow a period when the GGUF gives none:
# arch -> (period, dense layer first).
SWA_PERIODS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "gpt-oss": (2, False),
    "llama4": (4, False),
    "exaone4": (4, False),
    "exaone-moe": (4, False),
    "olmo2": (4, False),
    "plamo3": (8, False),
    "smallthinker": (4, True),
    "afmoe": (4, False),
    "mellum": (4, False),
    "laguna": (4, True),
    "muse-glimmer": (4, False),
    "modern-bert": (3, True),
}
# Sliding window sizes llama.cpp assumes when the key is absent.
SWA_DEFAULT_WINDOW: dict[str, int] = {"gemma2": 4096, "llama4": 8192}
# Architectures whose every layer is recurrent.
ALL_RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "falcon-h1"})
# Architectures whose every layer has attention as well (parallel hybrid).
ATTENTION_EVERYWHERE = frozenset({"falcon-h1"})
# Qwen3-next style hybrids: full_attention_interval defaults to 4.
INTERVAL_HYBRIDS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
# Hybrids whose recurrent layers are the ones with head_count_kv == 0.
ZERO_KV_HYBRIDS = frozenset(
    {"jamba", "granitehybrid", "nemotron_h", "nemotron_h_moe", "plamo2", "lfm2", "lfm2moe"}
)
# Encoders without a language-model head: no output layer, so no duplicated token_embd.
NO_LM_HEAD = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert"}
)
INPUT_TENSOR_PREFIXES = ("token_embd.", "position_embd.", "token_types.", "per_layer_token_embd.")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


class FootprintError(ValueError):
    """The header lacks what the arithmetic needs (e.g. no block_count), or an input is invalid."""


@attrs.frozen
class LayerGeometry:
    """What one repeating layer keeps besides its weights.

    ``kv_heads`` is 0 for a layer without a KV cache; ``recurrent_floats`` is the f32 element count of its
    recurrent state per sequence (0 for none).
    """

    kv_heads: int
    head_k: int
    head_v: int
    sliding: bool
    recurrent_floats: int


@attrs.frozen
class ModelGeometry:
    """Hyper-parameters and per-layer weight sizes of one model, read from its GGUF header.

    ``layer_weights[i]`` is the bytes of ``blk.i.*``; ``input_weights`` stay on the CPU;
    ``output_weights`` go with the output layer; ``tied_weights`` is the size of ``token_embd`` when the
    output reuses it (0 otherwise): llama.cpp loads that second copy when the output layer sits on a GPU,
    and shares the input's copy when it stays on the CPU (measured: a tied tiny model's CPU model buffer
    is the file's tensor bytes, not more). ``n_ctx_train`` is 0 when the header does not say.
    """

    arch: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_head: int
    n_ff: int
    n_vocab: int
    n_ff_expert: int
    n_expert_used: int
    ssm_inner: int
    n_swa: int
    layers: tuple[LayerGeometry, ...]
    layer_weights: tuple[int, ...]
    input_weights: int
    output_weights: int
    tied_weights: int
    file_weights: int

    @property
    def has_swa(self) -> bool:
        return any(layer.sliding for layer in self.layers)

    @property
    def has_recurrent(self) -> bool:
        return any(layer.recurrent_floats for layer in self.layers)

    @property
    def ffn_width(self) -> int:
        """Feed-forward activations per token: the dense width, or expert width x experts used."""
        return max(self.n_ff, self.n_ff_expert * max(self.n_expert_used, 1) if self.n_ff_expert else 0)


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FootprintError(f"{key} is {value!r}, expected an integer")
    return value


def _per_layer(header: GGUFHeader, suffix: str, n_layer: int, default: int | None) -> tuple[int, ...]:
    """A scalar-or-array key expanded to one integer per layer."""
    key = f"{header.arch}.{suffix}"
    value = header.metadata.get(key)
    if value is None:
        if key in header.arrays:
            raise FootprintError(f"{key} is an array too large to read ({header.arrays[key].length})")
        if default is None:
            raise FootprintError(f"the header has no {key}")
        return (default,) * n_layer
    if isinstance(value, tuple):
        values = tuple(_int(v, key) for v in value)
        if len(values) < n_layer:
            raise FootprintError(f"{key} has {len(values)} entries for {n_layer} layers")
        return values[:n_layer]
    return (_int(value, key),) * n_layer


def _swa_layers(header: GGUFHeader, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    if n_swa <= 0:
        return (False,) * n_layer
    arch = header.arch
    pattern = header.arch_get("attention.sliding_window_pattern")
    if isinstance(pattern, tuple):
        flags = tuple(bool(v) for v in pattern)
        if len(flags) < n_layer:
            raise FootprintError(f"{arch}.attention.sliding_window_pattern has {len(flags)} entries")
        return flags[:n_layer]
    period, dense_first = SWA_PERIODS.get(arch, (0, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period = pattern
    elif arch not in SWA_PERIODS:
        # A window without a pattern on an architecture llama.cpp does not slide (e.g. mistral as llama).
        return (False,) * n_layer
    if period == 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(i % period != 0 for i in range(n_layer))
    return tuple(i % period < period - 1 for i in range(n_layer))


def _recurrent_layers(header: GGUFHeader, n_layer: int, kv_heads: Sequence[int]) -> tuple[bool, ...]:
    arch = header.arch
    explicit = header.arch_get("attention.recurrent_layers")
    if isinstance(explicit, tuple):
        return tuple(bool(v) for v in explicit[:n_layer]) + (False,) * max(0, n_layer - len(explicit))
    interval = header.arch_get("full_attention_interval")
    if interval is None and arch in INTERVAL_HYBRIDS:
        interval = 4
    if isinstance(interval, int) and interval > 0:
        return tuple((i + 1) % interval != 0 for i in range(n_layer))
    if arch in ALL_RECURRENT:
        return (True,) * n_layer
    if arch in ZERO_KV_HYBRIDS:
        if arch.startswith("nemotron_h"):
            ff = _per_layer(header, "feed_forward_length", n_layer, 0)
            return tuple(kv_heads[i] == 0 and ff[i] == 0 for i in range(n_layer))
        return tuple(h == 0 for h in kv_heads)
    return (False,) * n_layer


def _recurrent_floats(header: GGUFHeader, n_embd: int) -> int:
    """f32 elements of one recurrent layer's state for one sequence (llama.cpp n_embd_r + n_embd_s)."""
    wkv = header.arch_get("wkv.head_size")
    if isinstance(wkv, int) and wkv > 0:
        shift = header.arch_get("token_shift_count", 2)
        return int(shift) * n_embd + n_embd * wkv
    l_cache = header.arch_get("shortconv.l_cache")
    if isinstance(l_cache, int) and l_cache > 0:
        return n_embd * (l_cache - 1)
    d_conv = int(header.arch_get("ssm.conv_kernel", 0) or 0)
    d_inner = int(header.arch_get("ssm.inner_size", 0) or 0)
    d_state = int(header.arch_get("ssm.state_size", 0) or 0)
    n_group = int(header.arch_get("ssm.group_count", 0) or 0)
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return conv + d_state * d_inner


def tensor_layer(name: str, n_layer: int) -> int | None:
    """The layer a tensor is loaded with: N for ``blk.N.*`` (N < n_layer), None for the input tensors
    (always in host memory), ``n_layer`` (the output layer) for every other tensor."""
    m = _BLOCK_RE.match(name)
    if m is not None and int(m.group(1)) < n_layer:
        return int(m.group(1))
    if name.startswith(INPUT_TENSOR_PREFIXES):
        return None
    return n_layer


def geometry_from_header(header: GGUFHeader) -> ModelGeometry:
    """Everything the arithmetic needs from a header; FootprintError when a required key is missing."""
    arch = header.arch
    n_layer = _block_count(header)
    n_embd = _int(header.arch_get("embedding_length", 0), f"{arch}.embedding_length")
    heads = _per_layer(header, "attention.head_count", n_layer, 0)
    kv_heads = _kv_heads(header, n_layer, heads)
    sizes = _head_sizes(header, n_embd, heads)
    n_swa = header.arch_get("attention.sliding_window")
    if n_swa is None:
        n_swa = SWA_DEFAULT_WINDOW.get(arch, 0)
    n_swa = _int(n_swa, f"{arch}.attention.sliding_window")
    layers = _layers(header, n_layer, n_embd, kv_heads, sizes, n_swa)
    weights = _tensor_weights(header, n_layer)
    n_vocab = _vocab_size(header)
    n_ff = max(_per_layer(header, "feed_forward_length", n_layer, 0), default=0)
    n_ff_exp = header.arch_get("expert_feed_forward_length", 0)
    if isinstance(n_ff_exp, tuple):
        n_ff_exp = max((int(v) for v in n_ff_exp), default=0)
    n_used = header.arch_get("expert_used_count", 0)
    n_ctx_train = header.arch_get("context_length", 0)
    return ModelGeometry(
        arch=arch,
        n_layer=n_layer,
        n_ctx_train=n_ctx_train if isinstance(n_ctx_train, int) else 0,
        n_embd=n_embd,
        n_head=max(heads) if heads else 0,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_ff_expert=int(n_ff_exp) if isinstance(n_ff_exp, int) else 0,
        n_expert_used=int(n_used) if isinstance(n_used, int) else 0,
        ssm_inner=int(header.arch_get("ssm.inner_size", 0) or 0),
        n_swa=n_swa,
        layers=layers,
        layer_weights=weights.layers,
        input_weights=weights.input,
        output_weights=weights.output,
        tied_weights=weights.tied,
        file_weights=header.n_bytes,
    )


def _block_count(header: GGUFHeader) -> int:
    arch = header.arch
    block_count = header.arch_get("block_count")
    if block_count is None:
        raise FootprintError(f"the header has no {arch}.block_count")
    n_layer = _int(block_count, f"{arch}.block_count")
    if n_layer <= 0:
        raise FootprintError(f"{arch}.block_count is {n_layer}")
    return n_layer


def _kv_heads(header: GGUFHeader, n_layer: int, heads: tuple[int, ...]) -> tuple[int, ...]:
    """KV heads per layer; head_count_kv defaults to head_count (no grouped-query attention)."""
    if (
        header.arch_get("attention.head_count_kv") is None
        and f"{header.arch}.attention.head_count_kv" not in header.arrays
    ):
        return heads
    return _per_layer(header, "attention.head_count_kv", n_layer, None)


def _head_sizes(header: GGUFHeader, n_embd: int, heads: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(key, value, sliding-window key, sliding-window value) sizes of one head; n_embd / head_count by
    default."""
    arch = header.arch
    first_head = next((h for h in heads if h), 0)
    default_head = n_embd // first_head if first_head else 0
    head_k = _int(header.arch_get("attention.key_length", default_head), f"{arch}.attention.key_length")
    head_v = _int(header.arch_get("attention.value_length", default_head), f"{arch}.attention.value_length")
    head_k_swa = _int(header.arch_get("attention.key_length_swa", head_k), f"{arch}.attention.key_length_swa")
    head_v_swa = _int(
        header.arch_get("attention.value_length_swa", head_v), f"{arch}.attention.value_length_swa"
    )
    return head_k, head_v, head_k_swa, head_v_swa


def _layers(
    header: GGUFHeader,
    n_layer: int,
    n_embd: int,
    kv_heads: Sequence[int],
    sizes: tuple[int, int, int, int],
    n_swa: int,
) -> tuple[LayerGeometry, ...]:
    """What each layer keeps: a KV cache (full or sliding), a recurrent state, or neither."""
    arch = header.arch
    head_k, head_v, head_k_swa, head_v_swa = sizes
    sliding = _swa_layers(header, n_layer, n_swa)
    recurrent = _recurrent_layers(header, n_layer, kv_heads)
    rs_floats = _recurrent_floats(header, n_embd) if any(recurrent) else 0

    # Layers from n_kv_from_start on reuse an earlier layer's cache (gemma3n: 20; gemma4: shared_kv_layers).
    n_kv_from_start = n_layer
    shared = header.arch_get("attention.shared_kv_layers")
    if isinstance(shared, int) and shared > 0:
        n_kv_from_start = n_layer - shared
    elif arch == "gemma3n":
        n_kv_from_start = min(n_layer, 20)

    layers = []
    for i in range(n_layer):
        has_kv = (
            kv_heads[i] > 0 and i < n_kv_from_start and (not recurrent[i] or arch in ATTENTION_EVERYWHERE)
        )
        slide = sliding[i] and has_kv
        layers.append(
            LayerGeometry(
                kv_heads=kv_heads[i] if has_kv else 0,
                head_k=head_k_swa if slide else head_k,
                head_v=head_v_swa if slide else head_v,
                sliding=slide,
                recurrent_floats=rs_floats if recurrent[i] else 0,
            )
        )
    return tuple(layers)


@attrs.frozen
class _TensorWeights:
    layers: tuple[int, ...]  # bytes of blk.i.*
    input: int  # token_embd and the other input tensors (host memory)
    output: int  # the output layer's tensors
    tied: int  # token_embd's bytes when the output reuses it (0 otherwise)


def _tensor_weights(header: GGUFHeader, n_layer: int) -> _TensorWeights:
    """The header's tensor bytes by where they are loaded (see the module doc)."""
    layer_weights = [0] * n_layer
    input_weights = output_weights = 0
    token_embd = 0
    has_output = False
    for t in header.tensors:
        m = _BLOCK_RE.match(t.name)
        if m is not None and int(m.group(1)) < n_layer:
            layer_weights[int(m.group(1))] += t.n_bytes
        elif t.name.startswith(INPUT_TENSOR_PREFIXES):
            input_weights += t.n_bytes
            if t.name == "token_embd.weight":
                token_embd = t.n_bytes
        else:
            # Output-layer tensors, and blk.N tensors beyond block_count (none in practice).
            output_weights += t.n_bytes
            has_output = has_output or t.name == "output.weight"
    tied = not has_output and token_embd > 0 and header.arch not in NO_LM_HEAD
    return _TensorWeights(tuple(layer_weights), input_weights, output_weights, token_embd if tied else 0)


def _vocab_size(header: GGUFHeader) -> int:
    n_vocab = header.arch_get("vocab_size")
    if not isinstance(n_vocab, int):
        tokens = header.arrays.get("tokenizer.ggml.tokens")
        embd = header.tensor("token_embd.weight")
        n_vocab = tokens.length if tokens else (embd.shape[-1] if embd and embd.shape else 0)
    return int(n_vocab)
