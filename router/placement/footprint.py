"""Memory footprint of a llama-server process, computed from a GGUF header.

For one model, a context size, a slot count (``-np``), KV cache types and a layer placement, this module
predicts what llama.cpp allocates on each device: model weights, KV cache (attention layers), recurrent
state (SSM / linear-attention layers), compute buffer, plus a fixed per-device reserve. The rules follow
llama.cpp (release 11434) and are summarised here; each function says more.

Model weights and which layers keep a KV cache or a recurrent state come from
``router.placement.geometry``; context sizes, KV cells and the micro-batch from
``router.placement.kv_layout`` (each module states its rules).

Layer placement (``-ngl``)
    llama.cpp counts the output layer as layer ``n_layer``: ``-ngl n_layer+1`` offloads everything. With
    ``-ngl k`` the last k of those ``n_layer+1`` layers are offloaded, the rest run on the CPU. Offloaded
    layers are split over the visible GPUs in proportion to a weight per GPU (llama.cpp's default weight is
    the free memory of each GPU): layer i goes to the first GPU whose cumulative share exceeds
    ``(i - first_offloaded) / k``.

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

Compute buffer
    See :func:`compute_bytes`: an estimate calibrated against llama-server's "compute buffer size" log
    lines (``tests/real/test_calibration_real.py``).

Reserve
    A fixed amount per device for what no buffer log shows: the CUDA/ROCm context, cuBLAS/hipBLAS
    workspaces, allocator slack, the host-side tokenizer. Default 512 MiB (Ollama keeps 457 MiB per CUDA
    GPU, gguf-parser 250 MiB, llama.cpp's own fitting a 1 GiB margin); configurable.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from router.placement.geometry import FootprintError, ModelGeometry
from router.placement.kv_layout import DEFAULT_UBATCH, ContextLayout, context_layout, kv_cell_bytes

__all__ = [
    "CPU",
    "DEFAULT_RESERVE",
    "DeviceFootprint",
    "Footprint",
    "assign_layers",
    "compute_bytes",
    "estimate",
]

MiB = 1 << 20
DEFAULT_RESERVE = 512 * MiB
CPU = "cpu"


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
    ngl, owner, moved = _layer_owners(geometry, devices, gpu_layers, shares, host_tensors)
    rows = []
    host_kv = 0
    for d_index, device in enumerate(devices):
        mine = [i for i in range(n_layer) if owner[i] == d_index]
        has_output = owner[n_layer] == d_index
        kv_token, kv, recurrent = _device_cache(geometry, mine, layout, cache_type_k, cache_type_v, n_seq)
        if not kv_offload and not cpu_only:
            host_kv += kv + recurrent
            kv_token = kv = recurrent = 0
        compute = 0  # a device holding no layer computes nothing
        if mine or has_output:
            compute = compute_bytes(
                geometry,
                layout,
                ubatch=ubatch,
                flash_attn=flash_attn,
                with_output=has_output,
                n_outputs=n_outputs,
            )
        rows.append(
            DeviceFootprint(
                device=device,
                layers=len(mine),
                weights=_device_weights(geometry, mine, has_output, moved, cpu_only),
                kv_per_token=kv_token,
                kv=kv,
                recurrent=recurrent,
                compute=compute,
                reserve=reserve,
            )
        )
    if cpu_only:
        return Footprint(layout=layout, gpu_layers=ngl, devices=tuple(rows), host_weights=0)
    on_host = _host_kept(geometry, owner, moved)
    if op_offload and min(ubatch, layout.n_ctx) >= OP_OFFLOAD_MIN_BATCH and max(on_host) > 0:
        rows[0] = attrs.evolve(rows[0], compute=rows[0].compute + max(on_host))
    host_weights = (
        geometry.input_weights + sum(on_host) - (geometry.tied_weights if owner[n_layer] is None else 0)
    )
    return Footprint(
        layout=layout, gpu_layers=ngl, devices=tuple(rows), host_weights=host_weights, host_kv=host_kv
    )


def _layer_owners(
    geometry: ModelGeometry,
    devices: Sequence[int | str],
    gpu_layers: int | None,
    shares: Sequence[float] | None,
    host_tensors: Sequence[int] | None,
) -> tuple[int, tuple[int | None, ...], tuple[int, ...]]:
    """(``-ngl``, the device index of layers 0..n_layer (the output layer last; None: the CPU), the bytes of
    each that tensor overrides keep in host memory). On the CPU alone every layer is device 0's."""
    n_layer = geometry.n_layer
    if tuple(devices) == (CPU,):
        return 0, (0,) * (n_layer + 1), (0,) * (n_layer + 1)  # nothing moved: all in host memory already
    if CPU in devices:
        raise FootprintError("the CPU cannot be listed with GPUs")
    ngl = n_layer + 1 if gpu_layers is None else max(gpu_layers, 0)
    owner = assign_layers(n_layer, ngl, shares if shares is not None else [1.0] * len(devices))
    return ngl, owner, _host_tensor_bytes(geometry, host_tensors)


def _device_weights(
    geometry: ModelGeometry, mine: Sequence[int], has_output: bool, moved: Sequence[int], cpu_only: bool
) -> int:
    """Weights of one device holding the layers ``mine`` (and the output layer when ``has_output``)."""
    weights = sum(geometry.layer_weights[i] - moved[i] for i in mine)
    if has_output:
        weights += geometry.output_weights - moved[geometry.n_layer]
    if cpu_only:
        weights += geometry.input_weights  # the tied output shares this copy
    elif has_output:
        weights += geometry.tied_weights  # a GPU-side copy of token_embd for the logits
    return weights


def _device_cache(
    geometry: ModelGeometry,
    mine: Sequence[int],
    layout: ContextLayout,
    cache_type_k: str,
    cache_type_v: str,
    n_seq: int,
) -> tuple[int, int, int]:
    """(KV bytes per context token, KV bytes, recurrent state bytes) of the layers ``mine``."""
    kv_token = kv = recurrent = 0
    for i in mine:
        layer = geometry.layers[i]
        cell = kv_cell_bytes(layer, cache_type_k, cache_type_v)
        if layer.sliding:
            kv += cell * layout.swa_cells_total
        else:
            kv_token += cell
            kv += cell * layout.full_cells
        recurrent += 4 * layer.recurrent_floats * max(1, n_seq)
    return kv_token, kv, recurrent


def _host_kept(geometry: ModelGeometry, owner: Sequence[int | None], moved: Sequence[int]) -> tuple[int, ...]:
    """Bytes of each layer (the output layer last) in host memory: layers left on the CPU by a partial -ngl
    (an operator override), and the tensors overridden to the CPU on offloaded layers."""
    n_layer = geometry.n_layer
    on_host = [(geometry.layer_weights[i] if owner[i] is None else moved[i]) for i in range(n_layer)]
    on_host.append(
        geometry.output_weights + geometry.tied_weights if owner[n_layer] is None else moved[n_layer]
    )
    return tuple(on_host)
