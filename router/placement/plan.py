"""The placement plan document: every model's verdict and footprint, as JSON and as a table.

``python -m router plan`` prints :func:`format_plan_table` of :func:`plan_document`; the same document is
what an API or a dashboard would serve. It is built from the GGUF headers alone: nothing is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.placement.budgets import DeviceBudget
from router.placement.fit import plan_model
from router.placement.footprint import CPU, DEFAULT_RESERVE
from router.placement.model_plan import Device, ModelPlan, PlacementInput
from router.placement.prompt_cache import host_summary, size_prompt_caches

__all__ = ["PLAN_VERSION", "format_plan_table", "host_total", "plan_document", "plan_models"]

PLAN_VERSION = 1
MiB = 1 << 20
GiB = 1 << 30


def plan_models(
    inputs: Iterable[PlacementInput],
    devices: Mapping[Device, int | None] | Mapping[Device, DeviceBudget],
    reserve: int = DEFAULT_RESERVE,
) -> list[ModelPlan]:
    """:func:`router.placement.fit.plan_model` for each input, against the same device budgets, then
    every model's prompt cache sized against the host (``router.placement.prompt_cache``)."""
    budgets = _budget_bytes(devices)
    inputs = list(inputs)
    plans = [plan_model(inp, budgets, reserve) for inp in inputs]
    return size_prompt_caches(plans, {inp.name: inp.cram for inp in inputs}, host_total(devices))


def _budget_bytes(devices: Mapping[Device, Any]) -> dict[Device, int | None]:
    return {d: (b.budget if isinstance(b, DeviceBudget) else b) for d, b in devices.items()}


def host_total(devices: Mapping[Device, Any]) -> int | None:
    """The host's memory as prompt caches are sized against it: the ``"cpu"`` device's total (a plain
    number given for it counts as the total); None when there is no such device or it is unknown."""
    host = devices.get(CPU)
    if isinstance(host, DeviceBudget):
        return host.total if host.declared is None else host.declared
    return host


def _device_entry(device: Device, value: Any) -> dict[str, Any]:
    if isinstance(value, DeviceBudget):
        return {
            "id": device,
            "kind": value.kind or ("cpu" if device == CPU else "gpu"),
            "name": value.name,
            "bus_id": value.bus_id,
            "total_bytes": value.total,
            "available_bytes": value.available,
            "foreign_bytes": value.foreign,
            "ours_bytes": value.ours,
            "method": value.method,
            "declared_bytes": value.declared,
            "budget_bytes": value.budget,
            "source": value.source,
        }
    return {
        "id": device,
        "kind": "cpu" if device == CPU else "gpu",
        "name": "",
        "bus_id": "",
        "total_bytes": None,
        "available_bytes": None,
        "foreign_bytes": None,
        "ours_bytes": None,
        "method": "",
        "declared_bytes": None,
        "budget_bytes": value,
        "source": "given" if value is not None else "unknown",
    }


def _model_entry(plan: ModelPlan) -> dict[str, Any]:
    return {
        "name": plan.name,
        "path": plan.path,
        "verdict": plan.verdict,
        "message": plan.message,
        "ctx": plan.ctx,
        "ctx_per_slot": plan.ctx_per_slot,
        "ctx_tried": plan.ctx_tried,
        "trained_ctx": plan.trained_ctx,
        "gpu_layers": plan.gpu_layers,
        "parallel": plan.parallel,
        "num_instance": plan.num_instance,
        "cache_type_k": plan.cache_type_k,
        "cache_type_v": plan.cache_type_v,
        "need_by_gpu": {str(gpu): need for gpu, need in plan.need_by_gpu.items()},
        "need_total_by_gpu": {str(gpu): need for gpu, need in plan.need_total_by_gpu.items()},
        "host_bytes": plan.host_bytes,
        "tensor_split": list(plan.tensor_split),
        "state_bytes_per_token": plan.state_bytes_per_token,
        "slot_state_bytes": plan.slot_state_bytes,
        "cram_mib": plan.cram_mib,
        "cram_source": plan.cram_source,
        "devices": [
            {
                "device": row.device,
                "layers": row.layers,
                "weights_bytes": row.weights,
                "kv_bytes_per_token": row.kv_per_token,
                "kv_bytes": row.kv,
                "recurrent_bytes": row.recurrent,
                "compute_bytes": row.compute,
                "reserve_bytes": row.reserve,
                "total_bytes": row.total,
                "budget_bytes": row.budget,
                "draft_bytes": row.draft,
                "projector_bytes": row.projector,
            }
            for row in plan.rows
        ],
    }


def plan_document(plans: Sequence[ModelPlan], devices: Mapping[Device, Any]) -> dict[str, Any]:
    """The versioned, JSON-able plan: ``{"version": 1, "devices": [...], "models": [...]}``.

    ``devices`` (one entry per device, GPUs by id then ``"cpu"``):
        ``id`` GPU id (int; an RPC device's scheduler id) or ``"cpu"``; ``kind`` ``"gpu"``, ``"rpc"`` or
        ``"cpu"``; ``name`` and ``bus_id`` (PCI)
        as the driver reports them; ``total_bytes`` memory reported by the driver or /proc/meminfo;
        ``available_bytes`` what this router may use (total minus ``foreign_bytes``, the memory other
        processes and the driver hold; ``ours_bytes`` is what our own replicas hold); ``method`` how
        ours and foreign were told apart (``idle``, ``processes``, ``baseline``, ``unattributed``;
        ``host`` for the CPU); all null when not measured; ``declared_bytes`` from ``[devices.N]
        memory_mib`` (null when not declared); ``budget_bytes`` what placement plans against (declared,
        else available; null when unknown); ``source`` where the budget came from: ``config``,
        ``nvml``, ``amdsmi``, ``sysfs``, ``host``, ``given`` or ``unknown``.

    ``models`` (one entry per model, in the order given):
        ``name``, ``path``; ``verdict`` one of ``fits``, ``refused``, ``override``, ``unknown-budget``,
        ``error``; ``message`` the human explanation (the arithmetic for refusals); ``ctx`` the ``-c``
        value to run with (null for refusals and errors); ``ctx_per_slot`` tokens each slot holds;
        ``ctx_tried`` the context the prediction below is for (the floor, for a refusal);
        ``trained_ctx`` the model's training context (0: unknown); ``gpu_layers`` the ``-ngl`` value;
        ``parallel`` slots (``-np``); ``num_instance`` replicas; ``cache_type_k``/``cache_type_v``;
        ``need_by_gpu`` bytes ONE replica needs per GPU id (string keys, as JSON requires);
        ``need_total_by_gpu`` the same for all replicas; ``host_bytes`` what one replica keeps in host
        memory besides compute buffers (token embeddings, layers and tensors left on the CPU, a
        projector that is not offloaded, the KV cache under ``--no-kv-offload``); ``tensor_split``
        the per-GPU weights (MiB) the layer split assumes, to pass as ``--tensor-split`` (empty for
        single-device models and when the operator sets it); ``state_bytes_per_token`` and
        ``slot_state_bytes`` what a cached conversation costs per full-attention token and at a full
        slot context; ``cram_mib`` the ``--cache-ram`` each replica gets and ``cram_source`` whence
        (``config``, ``auto``, ``host``: capped by the host's share); ``devices`` the per-device prediction
        for one replica: ``device``, ``layers`` (repeating layers held), ``weights_bytes``,
        ``kv_bytes_per_token`` (full-attention KV per context token), ``kv_bytes`` (all KV at
        ``ctx_tried``, sliding-window layers included), ``recurrent_bytes`` (fixed SSM state),
        ``compute_bytes``, ``reserve_bytes``, ``total_bytes``, ``budget_bytes``; ``draft_bytes`` and
        ``projector_bytes`` the parts of the total a draft model and a multimodal projector take
        (already inside the weights, KV and compute figures).

    ``host``: what all replicas together may keep in host memory, prompt caches included
        (``router.placement.prompt_cache.host_summary``); its ``warning`` says when that exceeds the
        host's memory.
    """
    gpus = sorted(((d, v) for d, v in devices.items() if isinstance(d, int)), key=lambda kv: kv[0])
    ordered = gpus + [(d, v) for d, v in devices.items() if not isinstance(d, int)]
    return {
        "version": PLAN_VERSION,
        "devices": [_device_entry(d, v) for d, v in ordered],
        "models": [_model_entry(p) for p in plans],
        "host": host_summary(plans, host_total(devices)),
    }


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [
        max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i])
        for i in range(len(header))
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _device_label(device: Mapping[str, Any]) -> str:
    if device["id"] == CPU:
        return "CPU"
    return f"RPC {device['id']}" if device.get("kind") == "rpc" else f"GPU {device['id']}"


def _row_label(row: Mapping[str, Any], kinds: Mapping[Any, Any]) -> str:
    device = row["device"]
    if device == CPU:
        return "CPU"
    return f"RPC {device}" if kinds.get(device) == "rpc" else f"GPU {device}"


def _cram(model: Mapping[str, Any]) -> str:
    mib = model.get("cram_mib")
    if mib is None:
        return "-"
    return f"{mib}" + ("" if model.get("cram_source") == "config" else f" ({model.get('cram_source')})")


def format_plan_table(doc: Mapping[str, Any]) -> str:
    """A plain-text rendering of :func:`plan_document` for terminals (sizes in GiB; ``host`` is the
    model's ``host_bytes`` per replica; ``cram`` its prompt cache in MiB per replica and, unless configured,
    how it was sized)."""
    out: list[str] = []
    dev_rows = [
        [
            _device_label(d),
            d["name"] or "",
            _gib(d["total_bytes"]),
            _gib(d["available_bytes"]),
            _gib(d["foreign_bytes"]),
            _gib(d["declared_bytes"]),
            _gib(d["budget_bytes"]),
            d["source"],
        ]
        for d in doc["devices"]
    ]
    out.append("Devices")
    header = ["device", "name", "total", "available", "others", "declared", "budget", "source"]
    out += _table(header, dev_rows, {2, 3, 4, 5, 6})
    out.append("")
    out.append("Models (GiB per replica)")
    kinds = {d["id"]: d.get("kind") for d in doc["devices"]}
    rows = []
    for m in doc["models"]:
        devs = m["devices"] or [None]
        for i, d in enumerate(devs):
            first = i == 0
            rows.append(
                [
                    m["name"] if first else "",
                    m["verdict"] if first else "",
                    (str(m["ctx"]) if m["ctx"] is not None else "-") if first else "",
                    (str(m["ctx_per_slot"]) if m["ctx_per_slot"] is not None else "-") if first else "",
                    (str(m["gpu_layers"]) if m["gpu_layers"] is not None else "-") if first else "",
                    "-" if d is None else _row_label(d, kinds),
                    "-" if d is None else _gib(d["weights_bytes"]),
                    "-" if d is None else _gib(d["kv_bytes"] + d["recurrent_bytes"]),
                    "-" if d is None else _gib(d["compute_bytes"]),
                    "-" if d is None else _gib(d["reserve_bytes"]),
                    "-" if d is None else _gib(d["total_bytes"]),
                    "-" if d is None else _gib(d["budget_bytes"]),
                    _cram(m) if first else "",
                    _gib(m["host_bytes"]) if first else "",
                    (f"x{m['num_instance']}" if m["num_instance"] > 1 else "") if first else "",
                ]
            )
    header = [
        "model",
        "verdict",
        "ctx",
        "per slot",
        "ngl",
        "device",
        "weights",
        "kv+state",
        "compute",
        "reserve",
        "total",
        "budget",
        "cram",
        "host",
        "replicas",
    ]
    out += _table(header, rows, {2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13})
    notes = [m["message"] for m in doc["models"] if m["message"]]
    host = doc.get("host") or {}
    if host.get("warning"):
        notes.append(host["warning"])
    if notes:
        out.append("")
        out += notes
    return "\n".join(out)
