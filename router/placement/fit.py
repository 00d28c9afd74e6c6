"""Fit verdicts: does a model fit its GPUs, and with how much context?

The rule is *refuse rather than spill*. In automatic mode (no ``ctx`` and no ``gpu_layers`` from the
operator) every layer goes to the model's GPUs and the context is the largest that fits; when even the
context floor does not fit, the model is refused with the arithmetic in the message. Automatic mode never
moves layers to the CPU to make room: partial offload is an operator's explicit choice (``gpu_layers``).

:func:`decide` is pure: geometry (from the GGUF header), the operator's inputs, device budgets and the
reserve in; a :class:`ModelPlan` out. :func:`plan_model` reads the header first.

Verdicts
    ``fits``            automatic mode found a context; ``ctx`` is what to pass to ``-c``.
    ``refused``         automatic mode: not even ``ctx_floor`` tokens of context fit; ``message`` has the
                        sums. The prediction (``rows``) is for every layer on the GPUs, at the floor.
    ``override``        ``ctx`` and/or ``gpu_layers`` came from the operator and are used as given (a
                        missing ``ctx`` is still chosen to fit); ``message`` warns when the prediction
                        exceeds a budget.
    ``unknown-budget``  some GPU's budget is unknown; the prediction is reported at the operator's
                        context or, failing that, the trained context (rounded down to ``256 *
                        parallel``).
    ``error``           the header could not be read or lacks what the arithmetic needs.

Context
    ``ctx`` is llama-server's ``-c``: the total over all ``parallel`` slots, each slot holding
    ``ctx_per_slot = ctx / parallel`` tokens. Automatic mode picks the largest ``ctx`` that fits among
    the multiples of ``256 * parallel`` (whole 256-cell blocks per slot, so the allocation is exactly the
    prediction) from ``ctx_floor`` (rounded up) to the trained context (``{arch}.context_length``,
    rounded down; llama.cpp's own default context). A floor above the trained context is capped to it;
    at least one 256-cell block per slot is always planned. Without a trained context in the header the
    floor is also the ceiling.

Several GPUs
    Layers are split in proportion to the GPUs' budgets; ``ModelPlan.tensor_split`` carries those
    weights for ``--tensor-split``, since llama.cpp would otherwise split by the free memory it sees.

A host without GPUs
    ``devices`` holding only ``"cpu"``: the model runs on the CPU (``-ngl 0``, any ``gpu_layers``
    ignored) against the host's available memory; the same verdicts apply.

Replicas
    ``num_instance`` replicas are separate processes on the same GPUs, each needing the full amount:
    ``need_by_gpu`` is per replica (what the scheduler reserves per process), and the fit test is on
    ``num_instance * need``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from router.config_values import FrozenMap
from router.placement.footprint import (
    CPU,
    DEFAULT_RESERVE,
    DEFAULT_UBATCH,
    Footprint,
    FootprintError,
    ModelGeometry,
    estimate,
    geometry_from_header,
)
from router.placement.gguf_header import GGUFError, read_header

__all__ = [
    "VERDICTS",
    "DeviceRow",
    "ModelPlan",
    "PlacementInput",
    "decide",
    "plan_model",
]

MiB = 1 << 20
GiB = 1 << 30
VERDICTS = ("fits", "refused", "override", "unknown-budget", "error")
Device = int | str


def _gpus(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class PlacementInput:
    """One model as the operator configured it.

    ``ctx`` and ``gpu_layers`` are operator overrides (None: automatic). ``flash_attn`` says whether
    llama-server runs with flash attention (its default ``auto`` turns it on wherever the backend supports
    it; quantised V caches require it). ``kv_unified`` mirrors ``--kv-unified`` (one KV stream shared by the
    slots instead of one per slot).
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
    flash_attn: bool = True
    kv_unified: bool = False


@attrs.frozen
class DeviceRow:
    """Per-replica prediction for one device, with its budget (None: unknown). Bytes throughout."""

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

    @property
    def label(self) -> str:
        return "CPU" if self.device == CPU else f"GPU {self.device}"


@attrs.frozen
class ModelPlan:
    """The placement decision for one model (see the module docstring for the verdicts).

    ``ctx`` is the ``-c`` value (None when there is none to give: errors, refusals report the floor they
    tried in ``ctx_tried``); ``ctx_per_slot`` the cells each slot gets (llama.cpp's n_ctx_seq);
    ``gpu_layers`` the ``-ngl`` value (``n_layer + 1`` = everything, 0 on a CPU-only host);
    ``rows`` one :class:`DeviceRow` per device; ``need_by_gpu`` the bytes one replica needs on each GPU
    (empty on a CPU-only host); ``host_bytes`` the weights one replica keeps in host memory (token
    embeddings, and layers a partial ``gpu_layers`` leaves on the CPU); ``trained_ctx`` the model's
    training context (0 when the header does not say). ``tensor_split`` (multi-GPU models with known
    budgets) holds the per-GPU weights, in MiB, the layer split was planned with: pass it as
    ``--tensor-split`` so llama.cpp splits the layers as planned instead of by the free memory it sees
    at load time.
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

    @property
    def need_total_by_gpu(self) -> dict[int, int]:
        """Bytes all ``num_instance`` replicas need together on each GPU."""
        return {gpu: need * self.num_instance for gpu, need in self.need_by_gpu.items()}

    @property
    def ok(self) -> bool:
        """True when the model may be loaded as planned (fits, or an operator override)."""
        return self.verdict in ("fits", "override", "unknown-budget")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f}"


def _rows(fp: Footprint, budgets: Mapping[Device, int | None]) -> tuple[DeviceRow, ...]:
    return tuple(
        DeviceRow(
            device=d.device,
            layers=d.layers,
            weights=d.weights,
            kv_per_token=d.kv_per_token,
            kv=d.kv,
            recurrent=d.recurrent,
            compute=d.compute,
            reserve=d.reserve,
            total=d.total,
            budget=budgets.get(d.device),
        )
        for d in fp.devices
    )


def _over(rows: Sequence[DeviceRow], replicas: int) -> list[DeviceRow]:
    """Rows whose replicas together exceed a known budget."""
    return [r for r in rows if r.budget is not None and r.total * replicas > r.budget]


def _breakdown(row: DeviceRow, ctx: int) -> str:
    parts = [f"weights {_gib(row.weights)}", f"KV at {ctx} ctx {_gib(row.kv)}"]
    if row.recurrent:
        parts.append(f"recurrent state {_gib(row.recurrent)}")
    parts += [f"compute {_gib(row.compute)}", f"reserve {_gib(row.reserve)}"]
    return " + ".join(parts)


def _shortfall(name: str, rows: Sequence[DeviceRow], ctx: int, replicas: int) -> str:
    """'NAME needs ~X GiB on GPU 0 (weights ... + reserve ...) but GPU 0 has Y GiB' for each device over."""
    clauses = []
    for row in rows:
        if replicas > 1:
            need = (
                f"{replicas} replicas need ~{_gib(row.total * replicas)} GiB on {row.label} "
                f"({_gib(row.total)} each: {_breakdown(row, ctx)})"
            )
        else:
            need = f"~{_gib(row.total)} GiB on {row.label} ({_breakdown(row, ctx)})"
            need = f"needs {need}"
        clauses.append(f"{need} but {row.label} has {_gib(row.budget)} GiB")
    return f"{name} " + "; ".join(clauses)


def _plan(
    inp: PlacementInput,
    geometry: ModelGeometry,
    verdict: str,
    message: str,
    fp: Footprint,
    budgets: Mapping[Device, int | None],
    *,
    ctx: int | None,
    cpu_only: bool,
) -> ModelPlan:
    rows = _rows(fp, budgets)
    need = {} if cpu_only else {int(r.device): r.total for r in rows}
    known = [b for b in budgets.values() if b is not None]
    split = tuple(max(1, b // MiB) for b in known) if len(known) == len(rows) > 1 else ()
    return ModelPlan(
        name=inp.name,
        path=str(inp.path),
        verdict=verdict,
        message=message,
        ctx=ctx,
        ctx_per_slot=fp.layout.n_ctx_seq if ctx is not None else None,
        ctx_tried=fp.layout.requested,
        gpu_layers=fp.gpu_layers,
        parallel=inp.parallel,
        num_instance=inp.num_instance,
        rows=rows,
        need_by_gpu=need,
        host_bytes=fp.host_weights,
        trained_ctx=geometry.n_ctx_train,
        cache_type_k=inp.cache_type_k,
        cache_type_v=inp.cache_type_v,
        tensor_split=split,
    )


def decide(
    inp: PlacementInput,
    geometry: ModelGeometry,
    devices: Mapping[Device, int | None],
    reserve: int = DEFAULT_RESERVE,
) -> ModelPlan:
    """The placement decision for one model whose header has been read (pure; see the module doc).

    ``devices`` maps each device to its budget in bytes (None: unknown). A mapping with GPUs (int keys)
    places the model on ``inp.gpus``; a mapping with only ``"cpu"`` means a host without GPUs: the model
    runs on the CPU (``-ngl 0``) against the host budget.
    """
    if inp.parallel < 1 or inp.num_instance < 1:
        return _error(inp, f"parallel ({inp.parallel}) and num_instance ({inp.num_instance}) must be >= 1")
    cpu_only = not any(isinstance(d, int) for d in devices) and CPU in devices
    targets: tuple[Device, ...] = (CPU,) if cpu_only else tuple(inp.gpus)
    if not targets:
        return _error(inp, "the model names no GPU")
    budgets = {d: devices.get(d) for d in targets}
    known = all(b is not None for b in budgets.values())
    shares = [float(b) for b in budgets.values() if b is not None] if known else None
    replicas = inp.num_instance
    gpu_layers = None if cpu_only else inp.gpu_layers

    def run(ctx: int) -> Footprint:
        return estimate(
            geometry,
            targets,
            ctx=ctx,
            n_seq=inp.parallel,
            cache_type_k=inp.cache_type_k,
            cache_type_v=inp.cache_type_v,
            gpu_layers=gpu_layers,
            shares=shares,
            ubatch=inp.ubatch,
            flash_attn=inp.flash_attn,
            unified=inp.kv_unified,
            reserve=reserve,
        )

    def fits(fp: Footprint) -> bool:
        return not _over(_rows(fp, budgets), replicas)

    def plan(verdict: str, message: str, fp: Footprint, ctx: int | None) -> ModelPlan:
        return _plan(inp, geometry, verdict, message, fp, budgets, ctx=ctx, cpu_only=cpu_only)

    try:
        # Candidate contexts are multiples of 256 * parallel, so every slot gets whole 256-cell blocks and
        # llama.cpp allocates exactly what is predicted.
        step = 256 * inp.parallel
        trained = geometry.n_ctx_train
        lo = max(1, -(-inp.ctx_floor // step))
        hi = (
            max(1, trained // step) if trained else lo
        )  # unknown training context: go no further than the floor
        lo = min(lo, hi)  # a floor above the trained context is capped to it

        if not known:
            ctx = inp.ctx if inp.ctx is not None else hi * step
            fp = run(ctx)
            unknown = ", ".join(str(d) for d, b in budgets.items() if b is None)
            msg = (
                f"{inp.name}: memory budget of GPU {unknown} unknown (no NVML reading and no "
                f"[devices.N] memory_mib); predicted need at {ctx} ctx: "
                + "; ".join(f"{r.label} ~{_gib(r.total)} GiB" for r in _rows(fp, budgets))
            )
            return plan("unknown-budget", msg, fp, ctx)

        override = inp.ctx is not None or (inp.gpu_layers is not None and not cpu_only)
        if inp.ctx is not None:
            fp = run(inp.ctx)
            return plan(
                "override", _override_message(inp, _rows(fp, budgets), inp.ctx, replicas), fp, inp.ctx
            )

        # The largest candidate context between the floor and the trained context whose footprint fits.
        fp_floor = run(lo * step)
        if not fits(fp_floor):
            ctx = lo * step
            if override:
                message = _override_message(inp, _rows(fp_floor, budgets), ctx, replicas)
                return plan("override", message, fp_floor, ctx)
            rows = _over(_rows(fp_floor, budgets), replicas)
            msg = (
                _shortfall(inp.name, rows, ctx, replicas)
                + ": choose a smaller quant or context, or free "
                + ("memory" if cpu_only else "VRAM")
            )
            return plan("refused", msg, fp_floor, None)
        best, best_fp = lo, fp_floor
        while lo < hi:
            mid = (lo + hi + 1) // 2
            fp = run(mid * step)
            if fits(fp):
                lo, best, best_fp = mid, mid, fp
            else:
                hi = mid - 1
        ctx = best * step
        where = ", ".join(
            f"{r.label} {_gib(r.total * replicas)}/{_gib(r.budget)} GiB" for r in _rows(best_fp, budgets)
        )
        note = f"{inp.name}: {ctx} ctx ({best * 256} per slot) fits: {where}"
        if replicas > 1:
            note += f" for {replicas} replicas"
        if override:
            return plan("override", note + f" with gpu_layers={inp.gpu_layers}", best_fp, ctx)
        return plan("fits", note, best_fp, ctx)
    except FootprintError as exc:
        return _error(inp, f"{inp.name}: {exc}")


def _override_message(inp: PlacementInput, rows: Sequence[DeviceRow], ctx: int, replicas: int) -> str:
    over = _over(rows, replicas)
    given = []
    if inp.ctx is not None:
        given.append(f"ctx={inp.ctx}")
    if inp.gpu_layers is not None:
        given.append(f"gpu_layers={inp.gpu_layers}")
    head = f"{inp.name}: operator setting {', '.join(given)} used as given"
    if not over:
        return head + "; predicted: " + "; ".join(f"{r.label} ~{_gib(r.total)} GiB" for r in rows)
    return f"{head}; warning: {_shortfall(inp.name, over, ctx, replicas)}: the load may fail or spill"


def _error(inp: PlacementInput, reason: str) -> ModelPlan:
    return ModelPlan(
        name=inp.name,
        path=str(inp.path),
        verdict="error",
        message=reason,
        parallel=inp.parallel,
        num_instance=inp.num_instance,
        cache_type_k=inp.cache_type_k,
        cache_type_v=inp.cache_type_v,
    )


def plan_model(
    inp: PlacementInput, devices: Mapping[Device, int | None], reserve: int = DEFAULT_RESERVE
) -> ModelPlan:
    """Read the model's GGUF header and :func:`decide`; an unreadable file gives the verdict "error"."""
    try:
        header = read_header(inp.path)
        geometry = geometry_from_header(header)
    except GGUFError as exc:  # its message names the file
        return _error(inp, f"{inp.name}: cannot read the model: {exc}")
    except (FootprintError, OSError) as exc:
        return _error(inp, f"{inp.name}: cannot place {os.fspath(inp.path)}: {exc}")
    return decide(inp, geometry, devices, reserve)
