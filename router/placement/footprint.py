"""Memory footprint of a llama-server process, computed from a GGUF header.

For one model, a context size, a slot count (``-np``), KV cache types and a layer placement, this module
predicts what llama.cpp allocates on each device: model weights, KV cache (attention layers), recurrent
state (SSM / linear-attention layers), compute buffer, plus a fixed per-device reserve. The rules follow
llama.cpp (release 11434) and are summarised here; each function says more.

Weights
    ``blk.N.*`` tensors go with layer N's device. ``token_embd`` (and the other input tensors:
    ``position_embd``, ``token_types``, ``per_layer_token_embd``) always stay on the CPU. Every other tensor
    (``output_norm``, ``output``, classifier heads, ...) belongs to the output layer, which sits on the
    device of the last layer. When ``output.weight`` is absent the model reuses ``token_embd`` for the
    logits and llama.cpp loads a second copy of it with the output layer.

Layer placement (``-ngl``)
    llama.cpp counts the output layer as layer ``n_layer``: ``-ngl n_layer+1`` offloads everything. With
    ``-ngl k`` the last k of those ``n_layer+1`` layers are offloaded, the rest run on the CPU. Offloaded
    layers are split over the visible GPUs in proportion to a weight per GPU (llama.cpp's default weight is
    the free memory of each GPU): layer i goes to the first GPU whose cumulative share exceeds
    ``(i - first_offloaded) / k``.

KV cache
    The context is padded up to a multiple of 256. With ``-np P`` slots and the default non-unified cache
    there are P streams of ``n_ctx_seq = pad256(n_ctx / P)`` cells each. A full-attention layer stores, per
    cell, ``row(type_k, kv_heads*head_k) + row(type_v, kv_heads*head_v)`` bytes, ``row`` being the ggml row
    size (for the block-quantised types: elements/32 blocks of 34 (q8_0), 18 (q4_0, iq4_nl), 20 (q4_1),
    22 (q5_0) or 24 (q5_1) bytes; f32 4, f16 and bf16 2 bytes an element). A sliding-window layer holds only
    ``pad256(min(n_ctx_seq, n_swa + n_ubatch))`` cells per stream (unified cache: one stream of
    ``pad256(min(n_ctx, n_swa*P + n_ubatch))``). Which layers slide: a ``sliding_window_pattern`` array
    (true = sliding), else an integer period N (llama.cpp: layer i slides unless ``i % N == N-1``; a few
    architectures count the dense layer first: unless ``i % N == 0``), else the architecture's built-in
    period (gemma2 2, gemma3 6, cohere2 4, gpt-oss 2, llama4 4, ...). No sliding at all when the window is 0.
    Layers that share another layer's cache (gemma3n, ``attention.shared_kv_layers``) hold none.

Micro-batch (``-ub``, ``-b``)
    ``n_ubatch`` (default 512) is clamped to ``n_batch`` (default 2048) and to the context; it sets the
    ``+ n_ubatch`` term of the sliding-window cells above and the token count of the compute buffer.

Full-size sliding-window cache (``--swa-full``)
    Sliding-window layers then hold as many cells as full-attention layers (llama.cpp sets the SWA cache
    size to the base size), so ``swa_cells = n_ctx_seq``.

KV cache in host memory (``--no-kv-offload``)
    The KV cache and the recurrent state of every layer go to host memory instead of the layer's GPU
    (``Footprint.host_kv``). The GPU compute buffer is still counted as if attention ran there: an
    overestimate, kept because the operator chose this to save GPU memory and the rest must stay safe.

Tensors kept in host memory (``--override-tensor PATTERN=CPU``, ``--cpu-moe``, ``--n-cpu-moe``)
    ``host_tensors[i]`` bytes of layer i (index ``n_layer``: the output layer) stay in host memory; they
    are taken off the GPU that holds the layer and counted in ``host_weights``. With op offload (llama.cpp's
    default, ``--no-op-offload`` turns it off) a large batch runs the matrix products of host-kept weights
    on the first GPU, copying one layer's weights at a time into that GPU's compute buffer; the first GPU's
    compute buffer therefore grows by the largest single layer kept on the host (whole layers left on the
    CPU by a partial ``-ngl`` included). llama.cpp offloads only batches of 32 tokens or more, so nothing
    is added below ``n_ubatch`` 32.

Recurrent state
    A recurrent layer keeps a fixed f32 state per sequence (``max(1, P)`` of them), whatever the context:
    ``(conv_kernel-1) * (inner_size + 2*group_count*state_size) + state_size*inner_size`` floats (Mamba,
    Mamba-2, gated delta net), ``token_shift_count*n_embd + n_embd*wkv_head_size`` (RWKV),
    ``n_embd*(l_cache-1)`` (LFM2 short convolutions). Which layers are recurrent: an
    ``attention.recurrent_layers`` array; else, Qwen3-next style, every layer except each
    ``full_attention_interval``-th (layer i is recurrent unless ``(i+1) % interval == 0``); else for
    Jamba/Granite-hybrid/Nemotron-H/PLaMo-2/LFM2 the layers whose ``head_count_kv`` is 0; every layer for
    Mamba, RWKV and Falcon-H1 (which also keeps attention in every layer).

Compute buffer
    See :func:`compute_bytes`: an estimate calibrated against llama-server's "compute buffer size" log
    lines (``tests/real/test_calibration_real.py``).

Reserve
    A fixed amount per device for what no buffer log shows: the CUDA/ROCm context, cuBLAS/hipBLAS
    workspaces, allocator slack, the host-side tokenizer. Default 512 MiB (Ollama keeps 457 MiB per CUDA
    GPU, gguf-parser 250 MiB, llama.cpp's own fitting a 1 GiB margin); configurable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs

from router.placement.gguf_header import GGUFHeader, ggml_type_size

__all__ = [
    "CACHE_TYPES",
    "CPU",
    "DEFAULT_RESERVE",
    "DEFAULT_UBATCH",
    "ContextLayout",
    "DeviceFootprint",
    "Footprint",
    "FootprintError",
    "LayerGeometry",
    "ModelGeometry",
    "assign_layers",
    "compute_bytes",
    "context_layout",
    "estimate",
    "geometry_from_header",
    "kv_cell_bytes",
    "pad256",
    "tensor_layer",
]

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_RESERVE = 512 * MiB
DEFAULT_UBATCH = 512
CPU = "cpu"

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
    block_count = header.arch_get("block_count")
    if block_count is None:
        raise FootprintError(f"the header has no {arch}.block_count")
    n_layer = _int(block_count, f"{arch}.block_count")
    if n_layer <= 0:
        raise FootprintError(f"{arch}.block_count is {n_layer}")
    n_embd = _int(header.arch_get("embedding_length", 0), f"{arch}.embedding_length")
    heads = _per_layer(header, "attention.head_count", n_layer, 0)
    # head_count_kv defaults to head_count (no grouped-query attention), per layer.
    if (
        header.arch_get("attention.head_count_kv") is None
        and f"{arch}.attention.head_count_kv" not in header.arrays
    ):
        kv_heads = heads
    else:
        kv_heads = _per_layer(header, "attention.head_count_kv", n_layer, None)
    n_head = max(heads) if heads else 0
    first_head = next((h for h in heads if h), 0)
    default_head = n_embd // first_head if first_head else 0
    head_k = _int(header.arch_get("attention.key_length", default_head), f"{arch}.attention.key_length")
    head_v = _int(header.arch_get("attention.value_length", default_head), f"{arch}.attention.value_length")
    head_k_swa = _int(header.arch_get("attention.key_length_swa", head_k), f"{arch}.attention.key_length_swa")
    head_v_swa = _int(
        header.arch_get("attention.value_length_swa", head_v), f"{arch}.attention.value_length_swa"
    )

    n_swa = header.arch_get("attention.sliding_window")
    if n_swa is None:
        n_swa = SWA_DEFAULT_WINDOW.get(arch, 0)
    n_swa = _int(n_swa, f"{arch}.attention.sliding_window")
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
    tied = not has_output and token_embd > 0 and arch not in NO_LM_HEAD

    n_vocab = header.arch_get("vocab_size")
    if not isinstance(n_vocab, int):
        tokens = header.arrays.get("tokenizer.ggml.tokens")
        embd = header.tensor("token_embd.weight")
        n_vocab = tokens.length if tokens else (embd.shape[-1] if embd and embd.shape else 0)
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
        n_head=n_head,
        n_ff=n_ff,
        n_vocab=int(n_vocab),
        n_ff_expert=int(n_ff_exp) if isinstance(n_ff_exp, int) else 0,
        n_expert_used=int(n_used) if isinstance(n_used, int) else 0,
        ssm_inner=int(header.arch_get("ssm.inner_size", 0) or 0),
        n_swa=n_swa,
        layers=tuple(layers),
        layer_weights=tuple(layer_weights),
        input_weights=input_weights,
        output_weights=output_weights,
        tied_weights=token_embd if tied else 0,
        file_weights=header.n_bytes,
    )


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


def assign_layers(n_layer: int, gpu_layers: int, shares: Sequence[float]) -> tuple[int | None, ...]:
    """Device index (into ``shares``) of layers 0..n_layer (the last entry is the output layer); None = CPU.

    ``gpu_layers`` is llama.cpp's ``-ngl`` (``n_layer + 1`` or more offloads all); ``shares`` weigh the
    devices (llama.cpp uses their free memory). Mirrors llama.cpp's split: cumulative shares normalised to
    1, layer i on the first device whose cumulative share exceeds ``(i - first_gpu_layer) / offloaded``.
    """
    if not shares or gpu_layers <= 0:
        return (None,) * (n_layer + 1)
    total = float(sum(shares))
    if total <= 0:
        shares = [1.0] * len(shares)
        total = float(len(shares))
    cumulative: list[float] = []
    acc = 0.0
    for s in shares:
        acc += s
        cumulative.append(acc / total)
    first = max(n_layer + 1 - gpu_layers, 0)
    active = min(gpu_layers, n_layer + 1)
    out: list[int | None] = []
    for il in range(n_layer + 1):
        if il < first:
            out.append(None)
            continue
        x = (il - first) / active
        dev = next((d for d, c in enumerate(cumulative) if c > x), len(cumulative) - 1)
        out.append(dev)
    return tuple(out)


def compute_bytes(
    geometry: ModelGeometry,
    layout: ContextLayout,
    *,
    ubatch: int = DEFAULT_UBATCH,
    flash_attn: bool = True,
    with_output: bool = True,
    n_outputs: int | None = None,
) -> int:
    """Estimated compute buffer of one device holding some layers (and the output layer when asked).

    llama.cpp sizes this buffer by reserving its worst graph: one micro-batch of ``u = min(ubatch, n_ctx)``
    tokens attending over a full KV stream, producing ``n_outputs`` rows of logits (llama-server asks for
    one per slot: ``-np``, more with speculative decoding). The buffer holds the largest set of
    intermediate f32 tensors alive at any one time. With E = n_embd, F = feed-forward width (a MoE layer:
    expert width x experts used), q = n_head x head size, kv = K+V width of one layer, V = vocabulary, in
    f32 elements:

    * feed-forward phase: ``u * (5E + 3F)`` (residual, norm, gate, up, their product, ...);
    * attention phase with flash attention: ``u * (2E + 4q + kv)``;
    * attention phase without flash attention: ``u * (4E + 2q + kv)`` plus the score matrix
      ``n_ctx_seq * u * n_head``;
    * recurrent phase (SSM layers): ``u * (2E + 6 * inner_size)``;
    * output phase (output device): ``V * n_outputs + 5E * u``;

    the buffer is the largest phase plus the attention mask ``n_ctx_seq * u`` (f16 with flash attention,
    f32 without; a second mask of ``swa_cells * u`` for sliding-window layers). Fitted against
    llama-server's "compute buffer size" log lines on the CPU backend over 37 llama shapes (n_embd 64 to
    2048, n_ff 128 to 8192, GQA 1:1 to 8:1, head sizes 16 to 128, 1 to 4 slots, flash attention on and
    off): within 0.1% wherever the feed-forward or the no-flash-attention phase dominates (every shape with
    n_ff >= 2.5 n_embd, i.e. real models); on toy shapes with a narrow feed-forward, where the overlap of
    short-lived tensors decides, between -7% and +28%. tests/real/test_calibration_real.py re-checks a
    handful. The CUDA/ROCm graph is the same; their temporary pools (cuBLAS workspaces, the flash-attention
    pool) are not in this buffer and are part of the per-device reserve.
    """
    u = min(ubatch, layout.n_ctx)
    e = geometry.n_embd
    ffn = geometry.ffn_width
    q = geometry.n_head * max((layer.head_k for layer in geometry.layers), default=0)
    kv = max((layer.kv_heads * (layer.head_k + layer.head_v) for layer in geometry.layers), default=0)
    n_kv = layout.n_ctx_seq
    phases = [5 * e + 3 * ffn]
    if flash_attn:
        phases.append(2 * e + 4 * q + kv)
    else:
        phases.append(4 * e + 2 * q + kv + n_kv * geometry.n_head)
    if geometry.has_recurrent:
        phases.append(2 * e + 6 * geometry.ssm_inner)
    peak = 4 * u * max(phases)
    if with_output:
        outputs = min(n_outputs if n_outputs is not None else layout.n_seq, u)
        peak = max(peak, 4 * (geometry.n_vocab * outputs + 5 * e * u))
    mask_bytes = 2 if flash_attn else 4
    mask = n_kv * u * mask_bytes
    if geometry.has_swa:
        mask += layout.swa_cells * u * mask_bytes
    return peak + mask


@attrs.frozen
class DeviceFootprint:
    """Predicted memory of one device (a GPU id, or ``"cpu"`` when the model runs on the CPU).

    ``kv_per_token`` is the bytes each context token costs in this device's full-attention layers (what
    grows with ``-c``); ``kv`` the whole KV cache at the chosen context including sliding-window layers;
    ``recurrent`` the fixed recurrent state; ``total = weights + kv + recurrent + compute + reserve``.
    ``draft`` and ``projector`` say how much of that total belongs to a draft model and to a multimodal
    projector (already counted in the other fields; see ``router.placement.extras``).
    """

    device: int | str
    layers: int
    weights: int
    kv_per_token: int
    kv: int
    recurrent: int
    compute: int
    reserve: int
    draft: int = 0
    projector: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.reserve


@attrs.frozen
class Footprint:
    """Per-device predictions for one replica, plus the host memory the GPU placement leaves on the CPU.

    ``host_weights`` are weights kept in host memory (token embeddings, layers a partial ``-ngl`` leaves on
    the CPU, tensors overridden to the CPU); ``host_kv`` the KV cache and recurrent state kept there by
    ``--no-kv-offload``. Both are 0 for a model that runs on the CPU alone, whose row holds everything.
    """

    layout: ContextLayout
    gpu_layers: int
    devices: tuple[DeviceFootprint, ...]
    host_weights: int
    host_kv: int = 0

    @property
    def host_bytes(self) -> int:
        return self.host_weights + self.host_kv


# llama.cpp runs a host-kept weight's product on a GPU only for batches of at least this many tokens.
OP_OFFLOAD_MIN_BATCH = 32


def _host_tensor_bytes(geometry: ModelGeometry, host_tensors: Sequence[int] | None) -> tuple[int, ...]:
    n = geometry.n_layer + 1
    if host_tensors is None:
        return (0,) * n
    values = tuple(int(b) for b in host_tensors)
    if len(values) != n:
        raise FootprintError(
            f"host tensor bytes need {n} entries (layers, then the output), got {len(values)}"
        )
    sizes = (*geometry.layer_weights, geometry.output_weights)
    if any(b < 0 or b > size for b, size in zip(values, sizes, strict=True)):
        raise FootprintError("host tensor bytes exceed a layer's weights")
    return values


def estimate(
    geometry: ModelGeometry,
    devices: Sequence[int | str],
    *,
    ctx: int,
    n_seq: int = 1,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    gpu_layers: int | None = None,
    shares: Sequence[float] | None = None,
    ubatch: int = DEFAULT_UBATCH,
    flash_attn: bool = True,
    unified: bool = False,
    swa_full: bool = False,
    kv_offload: bool = True,
    host_tensors: Sequence[int] | None = None,
    op_offload: bool = True,
    n_outputs: int | None = None,
    reserve: int = DEFAULT_RESERVE,
) -> Footprint:
    """Predict what one llama-server process of this model allocates on each device.

    ``devices`` are the GPUs the process sees, in the order it sees them, or ``("cpu",)`` for a run on the
    CPU alone (``-ngl 0``; everything, ``token_embd`` included, is then counted on the CPU device).
    ``gpu_layers`` defaults to all layers (``n_layer + 1``); ``shares`` weigh the layer split between
    GPUs (default: equal). ``ubatch`` is the effective micro-batch (already clamped to ``-b``);
    ``swa_full``, ``kv_offload`` (False: ``--no-kv-offload``), ``host_tensors`` (bytes per layer, output
    layer last, kept on the host by tensor overrides) and ``op_offload`` follow the module docstring;
    ``n_outputs`` is the logits rows per micro-batch (default: one per slot).
    """
    if not devices:
        raise FootprintError("no device to place the model on")
    layout = context_layout(
        ctx, n_seq, n_swa=geometry.n_swa, ubatch=ubatch, unified=unified, swa_full=swa_full
    )
    n_layer = geometry.n_layer
    cpu_only = tuple(devices) == (CPU,)
    if cpu_only:
        ngl = 0
        owner: tuple[int | None, ...] = (0,) * (n_layer + 1)
        moved = (0,) * (n_layer + 1)  # already in host memory
    else:
        if CPU in devices:
            raise FootprintError("the CPU cannot be listed with GPUs")
        ngl = n_layer + 1 if gpu_layers is None else max(gpu_layers, 0)
        owner = assign_layers(n_layer, ngl, shares if shares is not None else [1.0] * len(devices))
        moved = _host_tensor_bytes(geometry, host_tensors)

    rows = []
    host_weights = geometry.input_weights
    host_kv = 0
    for d_index, device in enumerate(devices):
        mine = [i for i in range(n_layer) if owner[i] == d_index]
        weights = sum(geometry.layer_weights[i] - moved[i] for i in mine)
        has_output = owner[n_layer] == d_index
        if has_output:
            weights += geometry.output_weights - moved[n_layer]
        if cpu_only:
            weights += geometry.input_weights  # the tied output shares this copy
        elif has_output:
            weights += geometry.tied_weights  # a GPU-side copy of token_embd for the logits
        kv_token = 0
        kv = 0
        recurrent = 0
        for i in mine:
            layer = geometry.layers[i]
            cell = kv_cell_bytes(layer, cache_type_k, cache_type_v)
            if layer.sliding:
                kv += cell * layout.swa_cells_total
            else:
                kv_token += cell
                kv += cell * layout.full_cells
            recurrent += 4 * layer.recurrent_floats * max(1, n_seq)
        if not kv_offload and not cpu_only:
            host_kv += kv + recurrent
            kv_token = kv = recurrent = 0
        compute = (
            compute_bytes(
                geometry,
                layout,
                ubatch=ubatch,
                flash_attn=flash_attn,
                with_output=has_output,
                n_outputs=n_outputs,
            )
            if mine or has_output
            else 0
        )
        rows.append(
            DeviceFootprint(
                device=device,
                layers=len(mine),
                weights=weights,
                kv_per_token=kv_token,
                kv=kv,
                recurrent=recurrent,
                compute=compute,
                reserve=reserve,
            )
        )
    if cpu_only:
        return Footprint(layout=layout, gpu_layers=ngl, devices=tuple(rows), host_weights=0)
    # Layers left on the CPU by a partial -ngl (an operator override) live in host memory, and so do the
    # tensors overridden to the CPU on offloaded layers.
    on_host = [(geometry.layer_weights[i] if owner[i] is None else moved[i]) for i in range(n_layer)]
    on_host.append(
        geometry.output_weights + geometry.tied_weights if owner[n_layer] is None else moved[n_layer]
    )
    host_weights += sum(on_host) - (geometry.tied_weights if owner[n_layer] is None else 0)
    if op_offload and min(ubatch, layout.n_ctx) >= OP_OFFLOAD_MIN_BATCH and max(on_host) > 0:
        rows[0] = attrs.evolve(rows[0], compute=rows[0].compute + max(on_host))
    return Footprint(
        layout=layout, gpu_layers=ngl, devices=tuple(rows), host_weights=host_weights, host_kv=host_kv
    )
