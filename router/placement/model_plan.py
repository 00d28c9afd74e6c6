"""What a placement decision takes and gives: the operator's inputs for one model (:class:`PlacementInput`)
and the decision (:class:`ModelPlan`, one :class:`DeviceRow` per device). ``router.placement.fit`` makes
the decision and documents the verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from router.frozenmap import FrozenMap
from router.placement.extras import DraftInput
from router.placement.footprint import CPU
from router.placement.kv_layout import DEFAULT_UBATCH

__all__ = ["DEFAULT_BATCH", "Device", "DeviceRow", "ModelPlan", "PlacementInput"]

Device = int | str
DEFAULT_BATCH = 2048  # llama.cpp's -b default; -ub is clamped to it


def _gpus(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class PlacementInput:
    """One model as the operator configured it.

    ``ctx`` and ``gpu_layers`` are operator overrides (None: automatic). ``flash_attn`` says whether
    llama-server runs with flash attention (its default ``auto`` turns it on wherever the backend supports
    it; quantised V caches require it). ``kv_unified`` mirrors ``--kv-unified`` (one KV stream shared by the
    slots instead of one per slot).

    The rest mirror llama-server flags (see ``router.placement.fit``): ``ubatch``/``batch`` (``-ub``/``-b``;
    the effective micro-batch is the smaller), ``swa_full``, ``kv_offload`` (False: ``--no-kv-offload``),
    ``op_offload`` (False: ``--no-op-offload``), ``tensor_split`` (the operator's ``--tensor-split``
    weights, one per GPU of ``gpus``; empty: split by budgets), ``host_patterns`` (tensor-name regexes
    kept in host memory) with ``host_flags`` (the flags as written, for messages), ``mmproj`` and
    ``mmproj_offload``, ``draft``; ``unsupported`` lists the flags placement cannot model, each with the
    reason, and makes the verdict "refused". ``cram`` is the configured prompt-cache size in MiB per
    replica (None: automatic, see ``router.placement.prompt_cache``). ``device_names`` labels devices in
    messages (a remote device, say) where "GPU N" would mislead; ``gpus`` lists every device in the order
    llama.cpp numbers them, which is the order the layers are split in.
    """

    name: str
    path: Path = attrs.field(converter=Path)
    gpus: tuple[int, ...] = attrs.field(default=(0,), converter=_gpus)
    parallel: int = 1
    num_instance: int = 1
    ctx: int | None = None
    gpu_layers: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    ubatch: int = DEFAULT_UBATCH
    ctx_floor: int = 2048
    ctx_default: int = 4096
    flash_attn: bool = True
    kv_unified: bool = False
    batch: int = DEFAULT_BATCH
    swa_full: bool = False
    kv_offload: bool = True
    op_offload: bool = True
    tensor_split: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    host_patterns: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    host_flags: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    mmproj: Path | None = None
    mmproj_offload: bool = True
    draft: DraftInput | None = None
    unsupported: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    cram: int | None = None
    device_names: FrozenMap[int, str] = attrs.field(factory=FrozenMap, converter=FrozenMap)


@attrs.frozen
class DeviceRow:
    """Per-replica prediction for one device, with its budget (None: unknown). Bytes throughout.

    ``draft`` and ``projector`` are the parts of ``total`` a draft model and a projector take (already
    inside weights, kv, recurrent and compute). ``name`` replaces "GPU N" in messages when set."""

    device: Device
    layers: int
    weights: int
    kv_per_token: int
    kv: int
    recurrent: int
    compute: int
    reserve: int
    total: int
    budget: int | None
    draft: int = 0
    projector: int = 0
    name: str = ""

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return "CPU" if self.device == CPU else f"GPU {self.device}"


@attrs.frozen
class ModelPlan:
    """The placement decision for one model (see ``router.placement.fit`` for the verdicts).

    ``ctx`` is the ``-c`` value (None when there is none to give: errors, refusals report the floor they
    tried in ``ctx_tried``); ``ctx_per_slot`` the cells each slot gets (llama.cpp's n_ctx_seq);
    ``gpu_layers`` the ``-ngl`` value (``n_layer + 1`` = everything, 0 on a CPU-only host);
    ``rows`` one :class:`DeviceRow` per device; ``need_by_gpu`` the bytes one replica needs on each GPU
    (empty on a CPU-only host); ``host_bytes`` what one replica keeps in host memory besides compute
    buffers (token embeddings, layers a partial ``gpu_layers`` leaves on the CPU, tensors overridden to
    the CPU, a projector that is not offloaded, the KV cache under ``--no-kv-offload``, and the same for
    a draft model); ``trained_ctx`` the model's
    training context (0 when the header does not say). ``tensor_split`` (multi-GPU models with known
    budgets) holds the per-GPU weights, in MiB, the layer split was planned with: pass it as
    ``--tensor-split`` so llama.cpp splits the layers as planned instead of by the free memory it sees
    at load time. ``state_bytes_per_token`` is what one more token of a cached conversation costs in the
    full-attention layers, ``slot_state_bytes`` the state of one full slot context (sliding-window and
    recurrent layers included; see ``router.placement.prompt_cache``); ``cram_mib`` the ``--cache-ram``
    figure each replica gets and ``cram_source`` where it came from (``config``, ``auto``, or ``host``
    when the host's share capped the automatic figure), both set once every model is planned.
    """

    name: str
    path: str
    verdict: str
    message: str
    ctx: int | None = None
    ctx_per_slot: int | None = None
    ctx_tried: int | None = None
    gpu_layers: int | None = None
    parallel: int = 1
    num_instance: int = 1
    rows: tuple[DeviceRow, ...] = ()
    need_by_gpu: FrozenMap[int, int] = attrs.field(factory=FrozenMap, converter=FrozenMap)
    host_bytes: int = 0
    trained_ctx: int = 0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    tensor_split: tuple[int, ...] = ()
    state_bytes_per_token: int = 0
    slot_state_bytes: int = 0
    cram_mib: int | None = None
    cram_source: str = ""

    @property
    def need_total_by_gpu(self) -> dict[int, int]:
        """Bytes all ``num_instance`` replicas need together on each GPU."""
        return {gpu: need * self.num_instance for gpu, need in self.need_by_gpu.items()}

    @property
    def ok(self) -> bool:
        """True when the model may be loaded as planned (fits, or an operator override)."""
        return self.verdict in ("fits", "override", "unknown-budget")
