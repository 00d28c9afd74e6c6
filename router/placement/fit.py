"""Fit verdicts: does a model fit its GPUs, and with how much context?

The rule is *refuse rather than spill*. In automatic mode (no ``ctx`` and no ``gpu_layers`` from the
operator) every layer goes to the model's GPUs and the context is the largest that fits; when even the
context floor does not fit, the model is refused with the arithmetic in the message. Automatic mode never
moves layers to the CPU to make room: partial offload is an operator's explicit choice (``gpu_layers``).

:func:`decide` is pure: geometry (from the GGUF header), the operator's inputs, device budgets and the
reserve in; a :class:`~router.placement.model_plan.ModelPlan` out. :func:`plan_model` reads the header
first. The messages are worded by ``router.placement.fit_messages``.

Verdicts
    ``fits``            automatic mode found a context; ``ctx`` is what to pass to ``-c``.
    ``refused``         automatic mode: not even ``ctx_floor`` tokens of context fit; ``message`` has the
                        sums. The prediction (``rows``) is for every layer on the GPUs, at the floor.
                        Also: a llama-server flag placement cannot model (``PlacementInput.unsupported``;
                        ``message`` names the flag and why, ``rows`` is empty). Refused rather than
                        "error" because "error" starts the model blind, and a GPU shared with other models
                        must not be filled by a load nobody predicted.
    ``override``        ``ctx`` and/or ``gpu_layers`` came from the operator and are used as given (a
                        missing ``ctx`` is still chosen to fit); ``message`` warns when the prediction
                        exceeds a budget. Any flag that keeps something in host memory (tensor overrides,
                        ``--no-kv-offload``, ``--no-mmproj-offload``, a partial ``-ngld``) is such an
                        operator setting too, and the message says what it moved and how much.
    ``unknown-budget``  some GPU's memory cannot be read and is not declared. The GPU is still a GPU:
                        every layer is offloaded, and the context is the operator's or
                        ``min(trained context, ctx_default)`` (rounded down to ``256 * parallel``); the
                        prediction is reported at that context.
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
    ``inp.gpus`` lists the devices in llama.cpp's order, remote (RPC) devices first; placement does not
    tell them apart, ``inp.device_names`` only labels them in messages.

Models without a GPU
    ``gpus = ()`` (the operator's explicit choice: ``gpus = []`` or ``num_gpus = 0``): the model runs on
    the CPU (``-ngl 0``, any ``gpu_layers`` ignored) against the host's available memory (the ``"cpu"``
    device); the same verdicts apply. Nothing else is ever planned on the CPU.

llama-server flags
    ``PlacementInput`` carries every flag that moves memory, read by ``router.deploy.memory_flags``: the
    micro-batch (``ubatch`` clamped to ``batch``), ``--kv-unified``, ``--swa-full``,
    ``--no-kv-offload``, ``--tensor-split`` (then the operator's split is used, not the budgets'; ``-sm
    none`` arrives as all weight on the first GPU), tensor overrides, a projector and a draft model. The
    companions' headers are read by :func:`plan_model` into an :class:`~router.placement.extras.Extras`
    and added by ``router.placement.extras`` (see there for the rules).

Replicas
    ``num_instance`` replicas are separate processes on the same GPUs, each needing the full amount:
    ``need_by_gpu`` is per replica (what the scheduler reserves per process), and the fit test is on
    ``num_instance * need``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from router.placement.extras import Extras, add_draft, add_projector, read_extras
from router.placement.fit_messages import gib, operator_settings, over_budget, override_message, shortfall
from router.placement.footprint import CPU, DEFAULT_RESERVE, Footprint, estimate
from router.placement.geometry import FootprintError, ModelGeometry, geometry_from_header
from router.placement.gguf_header import GGUFError, read_header
from router.placement.model_plan import Device, DeviceRow, ModelPlan, PlacementInput
from router.placement.prompt_cache import sequence_cost

__all__ = ["decide", "plan_model"]

MiB = 1 << 20


def _rows(
    fp: Footprint, budgets: Mapping[Device, int | None], names: Mapping[int, str] | None = None
) -> tuple[DeviceRow, ...]:
    names = names or {}
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
            draft=d.draft,
            projector=d.projector,
            name=names.get(d.device, "") if isinstance(d.device, int) else "",
        )
        for d in fp.devices
    )


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
    rows = _rows(fp, budgets, inp.device_names)
    need = {} if cpu_only else {int(r.device): r.total for r in rows}
    state = sequence_cost(
        geometry,
        cache_type_k=inp.cache_type_k,
        cache_type_v=inp.cache_type_v,
        ubatch=min(inp.ubatch, inp.batch),
        swa_full=inp.swa_full,
    )
    known = [b for b in budgets.values() if b is not None]
    split = tuple(max(1, b // MiB) for b in known) if len(known) == len(rows) > 1 else ()
    if inp.tensor_split:
        split = ()  # the operator's --tensor-split is on the command line already
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
        host_bytes=fp.host_bytes,
        trained_ctx=geometry.n_ctx_train,
        cache_type_k=inp.cache_type_k,
        cache_type_v=inp.cache_type_v,
        tensor_split=split,
        state_bytes_per_token=state.per_token,
        slot_state_bytes=state.bytes_at(fp.layout.n_ctx_seq),
    )


def decide(
    inp: PlacementInput,
    geometry: ModelGeometry,
    devices: Mapping[Device, int | None],
    reserve: int = DEFAULT_RESERVE,
    extras: Extras | None = None,
) -> ModelPlan:
    """The placement decision for one model whose header has been read (pure; see the module doc).

    ``devices`` maps each device to its budget in bytes (None: unknown). A mapping with GPUs (int keys)
    places the model on ``inp.gpus``; a mapping with only ``"cpu"`` means a host without GPUs: the model
    runs on the CPU (``-ngl 0``) against the host budget. ``extras`` holds what the companions' headers
    say (required when ``inp`` has tensor overrides, a projector or a draft model).
    """
    if inp.unsupported:
        return _unsupported(inp)
    extras = extras if extras is not None else Extras()
    if inp.parallel < 1 or inp.num_instance < 1:
        return _error(inp, f"parallel ({inp.parallel}) and num_instance ({inp.num_instance}) must be >= 1")
    placer = _Placer.of(inp, geometry, devices, reserve, extras)
    try:
        return placer.verdict()
    except FootprintError as exc:
        return _error(inp, f"{inp.name}: {exc}")


@attrs.frozen
class _Placer:
    """One model's decision in the making: its inputs, its devices' budgets, and the footprint of a
    candidate context (what :func:`decide` tries until a verdict is reached)."""

    inp: PlacementInput
    geometry: ModelGeometry
    extras: Extras
    reserve: int
    cpu_only: bool
    targets: tuple[Device, ...]
    budgets: Mapping[Device, int | None]
    known: bool  # every budget is known
    shares: list[float] | None  # the layer split's weights (None: equal)
    settings: list[str]  # the operator's settings that keep something in host memory

    @classmethod
    def of(
        cls,
        inp: PlacementInput,
        geometry: ModelGeometry,
        devices: Mapping[Device, int | None],
        reserve: int,
        extras: Extras,
    ) -> _Placer:
        cpu_only = not inp.gpus
        targets: tuple[Device, ...] = (CPU,) if cpu_only else tuple(inp.gpus)
        budgets = {d: devices.get(d) for d in targets}
        known = all(b is not None for b in budgets.values())
        shares = [float(b) for b in budgets.values() if b is not None] if known else None
        if inp.tensor_split and not cpu_only:
            shares = _operator_shares(inp.tensor_split, len(targets))
        settings = operator_settings(inp, extras, cpu_only)
        return cls(inp, geometry, extras, reserve, cpu_only, targets, budgets, known, shares, settings)

    # ---- the verdicts ------------------------------------------------------------------------------

    def verdict(self) -> ModelPlan:
        """Which verdict applies (see the module doc), with its context and prediction."""
        inp = self.inp
        # Candidate contexts are multiples of 256 * parallel, so every slot gets whole 256-cell blocks and
        # llama.cpp allocates exactly what is predicted.
        step = 256 * inp.parallel
        trained = self.geometry.n_ctx_train
        lo = max(1, -(-inp.ctx_floor // step))
        # Without a trained context, go no further than the floor.
        hi = max(1, trained // step) if trained else lo
        lo = min(lo, hi)  # a floor above the trained context is capped to it
        if not self.known:
            return self._unknown_budget(max(1, min(hi, inp.ctx_default // step)) * step)
        if inp.ctx is not None:
            fp = self.footprint(inp.ctx)
            message = override_message(inp, self.settings, self.rows(fp), inp.ctx, inp.num_instance)
            return self.plan("override", message, fp, inp.ctx)
        return self._largest_fitting(lo, hi, step)

    def _unknown_budget(self, default: int) -> ModelPlan:
        """Some budget cannot be read: every layer offloaded, at the operator's ctx or ``default``."""
        inp = self.inp
        ctx = inp.ctx if inp.ctx is not None else default
        fp = self.footprint(ctx)
        unknown = ", ".join(str(d) for d, b in self.budgets.items() if b is None)
        msg = (
            f"{inp.name}: memory of GPU {unknown} cannot be read (no NVML, amdsmi or sysfs reading) "
            "and no [devices.N] memory_mib is declared: every layer is offloaded "
            f"and ctx is {ctx} ({'as configured' if inp.ctx is not None else 'ctx_default'}); "
            "predicted need: "
            + "; ".join(f"{r.label} ~{gib(r.total)} GiB" for r in self.rows(fp))
            + ". Declare the GPU's memory to plan against it."
        )
        return self.plan("unknown-budget", msg, fp, ctx)

    def _largest_fitting(self, lo: int, hi: int, step: int) -> ModelPlan:
        """The largest candidate context between the floor (``lo * step``) and the trained context
        (``hi * step``) whose footprint fits; refused (or an override's warning) when the floor does not."""
        inp, replicas, settings = self.inp, self.inp.num_instance, self.settings
        fp_floor = self.footprint(lo * step)
        if not self.fits(fp_floor):
            return self._floor_over_budget(fp_floor, lo * step)
        best, best_fp = lo, fp_floor
        while lo < hi:
            mid = (lo + hi + 1) // 2
            fp = self.footprint(mid * step)
            if self.fits(fp):
                lo, best, best_fp = mid, mid, fp
            else:
                hi = mid - 1
        ctx = best * step
        where = ", ".join(
            f"{r.label} {gib(r.total * replicas)}/{gib(r.budget)} GiB" for r in self.rows(best_fp)
        )
        note = f"{inp.name}: {ctx} ctx ({best * 256} per slot) fits: {where}"
        if replicas > 1:
            note += f" for {replicas} replicas"
        if settings:
            return self.plan("override", note + " with " + ", ".join(settings), best_fp, ctx)
        return self.plan("fits", note, best_fp, ctx)

    def _floor_over_budget(self, fp_floor: Footprint, ctx: int) -> ModelPlan:
        inp, replicas = self.inp, self.inp.num_instance
        if self.settings:
            message = override_message(inp, self.settings, self.rows(fp_floor), ctx, replicas)
            return self.plan("override", message, fp_floor, ctx)
        rows = over_budget(self.rows(fp_floor), replicas)
        msg = (
            shortfall(inp.name, rows, ctx, replicas)
            + ": choose a smaller quant or context, or free "
            + ("memory" if self.cpu_only else "VRAM")
        )
        return self.plan("refused", msg, fp_floor, None)

    # ---- the footprint at one context --------------------------------------------------------------

    def footprint(self, ctx: int) -> Footprint:
        """The model's footprint at ``ctx`` with its draft model and projector added."""
        inp, extras = self.inp, self.extras
        if inp.host_patterns and extras.host is None:
            raise FootprintError("the tensor overrides were not matched against the header")
        # With a draft model each slot verifies 1 + n_max tokens a step, and the main model computes logits
        # for all of them.
        n_outputs = inp.parallel * (1 + max(inp.draft.n_max, 0)) if inp.draft is not None else None
        fp = self._estimate(
            self.geometry,
            ctx,
            cache_type_k=inp.cache_type_k,
            cache_type_v=inp.cache_type_v,
            gpu_layers=None if self.cpu_only else inp.gpu_layers,
            host_tensors=extras.host.by_layer if extras.host is not None else None,
            n_outputs=n_outputs,
            reserve=self.reserve,
        )
        if inp.draft is not None:
            fp = add_draft(fp, self._draft_footprint(ctx))
        if inp.mmproj is not None:
            if extras.projector is None:
                raise FootprintError("the projector's header was not read")
            fp = add_projector(fp, extras.projector, offload=inp.mmproj_offload, flash_attn=inp.flash_attn)
        return fp

    def _draft_footprint(self, ctx: int) -> Footprint:
        draft, extras = self.inp.draft, self.extras
        assert draft is not None
        if extras.draft is None:
            raise FootprintError("the draft model's header was not read")
        if draft.host_patterns and extras.draft_host is None:
            raise FootprintError("the draft model's tensor overrides were not matched against its header")
        return self._estimate(
            extras.draft,
            draft.ctx if draft.ctx is not None else ctx,
            cache_type_k=draft.cache_type_k,
            cache_type_v=draft.cache_type_v,
            gpu_layers=None if self.cpu_only else draft.gpu_layers,
            host_tensors=extras.draft_host.by_layer if extras.draft_host is not None else None,
            reserve=0,
        )

    def _estimate(self, model: ModelGeometry, ctx: int, **kw: Any) -> Footprint:
        inp = self.inp
        return estimate(
            model,
            self.targets,
            ctx=ctx,
            n_seq=inp.parallel,
            shares=self.shares,
            ubatch=min(inp.ubatch, inp.batch),
            flash_attn=inp.flash_attn,
            unified=inp.kv_unified,
            swa_full=inp.swa_full,
            kv_offload=inp.kv_offload,
            op_offload=inp.op_offload,
            **kw,
        )

    def rows(self, fp: Footprint) -> tuple[DeviceRow, ...]:
        return _rows(fp, self.budgets, self.inp.device_names)

    def fits(self, fp: Footprint) -> bool:
        return not over_budget(self.rows(fp), self.inp.num_instance)

    def plan(self, verdict: str, message: str, fp: Footprint, ctx: int | None) -> ModelPlan:
        return _plan(
            self.inp, self.geometry, verdict, message, fp, self.budgets, ctx=ctx, cpu_only=self.cpu_only
        )


def _operator_shares(split: Sequence[float], n: int) -> list[float]:
    """The operator's --tensor-split weights for n visible GPUs (missing entries weigh 0)."""
    return [max(0.0, float(v)) for v in split[:n]] + [0.0] * max(0, n - len(split))


def _unsupported(inp: PlacementInput) -> ModelPlan:
    message = (
        f"{inp.name}: placement cannot predict the memory of " + "; ".join(inp.unsupported) + ". Remove the "
        "flag (or set it to false in the model's table to drop a [defaults] one) to have the model placed"
    )
    return _without_prediction(inp, "refused", message)


def _error(inp: PlacementInput, reason: str) -> ModelPlan:
    return _without_prediction(inp, "error", reason)


def _without_prediction(inp: PlacementInput, verdict: str, message: str) -> ModelPlan:
    """A plan with a verdict and its message but no figures (nothing was, or could be, predicted)."""
    return ModelPlan(
        name=inp.name,
        path=str(inp.path),
        verdict=verdict,
        message=message,
        parallel=inp.parallel,
        num_instance=inp.num_instance,
        cache_type_k=inp.cache_type_k,
        cache_type_v=inp.cache_type_v,
    )


def plan_model(
    inp: PlacementInput, devices: Mapping[Device, int | None], reserve: int = DEFAULT_RESERVE
) -> ModelPlan:
    """Read the model's GGUF header (and its projector's and draft model's) and :func:`decide`.

    An unreadable file gives the verdict "error"; a flag placement cannot model, "refused" before any
    file is read.
    """
    if inp.unsupported:
        return _unsupported(inp)
    try:
        header = read_header(inp.path)
        geometry = geometry_from_header(header)
    except GGUFError as exc:  # its message names the file
        return _error(inp, f"{inp.name}: cannot read the model: {exc}")
    except (FootprintError, OSError) as exc:
        return _error(inp, f"{inp.name}: cannot place {os.fspath(inp.path)}: {exc}")
    try:
        extras = read_extras(
            header, geometry, host_patterns=inp.host_patterns, mmproj=inp.mmproj, draft=inp.draft
        )
    except (GGUFError, FootprintError, OSError) as exc:
        return _error(inp, f"{inp.name}: {exc}")
    return decide(inp, geometry, devices, reserve, extras)
