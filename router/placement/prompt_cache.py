"""llama-server's prompt cache in host memory (``--cache-ram``): what a cached conversation costs, the
automatic size of the cache, and what all replicas together may keep in host memory.

llama-server keeps the sequence states of recent prompts in host RAM, so that a conversation that comes
back (or a new one that starts with the same prefix) continues from its state instead of computing its
prompt again. ``--cache-ram N`` caps that cache at N MiB per process; nothing is allocated until a state is
stored. The router sets N for every replica: the model's ``cram`` key, else the automatic figure below.

Cost of one cached conversation of ``n`` tokens (:class:`SequenceCost`)
    full-attention layers: ``n`` × their KV bytes per token (the K and V rows of every such layer, in the
    cache types the replica runs with); sliding-window layers: only the window each sequence keeps,
    ``min(n, window)`` cells with ``window = pad256(n_swa + n_ubatch)`` (all ``n`` cells with
    ``--swa-full``); recurrent layers (SSM, linear attention): their fixed state per sequence, whatever
    ``n``. A full slot context is ``n = ctx_per_slot``.

Automatic size (:func:`auto_cram_mib`)
    Room for :data:`SLOT_CONTEXTS_KEPT` full slot contexts beyond the live slots, rounded up to whole MiB
    and clamped to :data:`CRAM_MIN_MIB` .. :data:`CRAM_MAX_MIB` (llama-server's own default is the
    maximum, whatever the model).

Host memory (:func:`size_prompt_caches`, :func:`host_summary`)
    Against the host's total memory (``MemTotal``; the available memory moves with what runs, our own
    replicas included, and a figure that moved on every reload would restart replicas for nothing). What
    the plan already keeps there per replica (``ModelPlan.host_bytes``; the whole footprint of a model
    that runs on the CPU) is set aside first; automatic figures then share at most half of the rest, so
    the system, other programs and the page cache keep the other half. A configured ``cram`` is used as
    given. When all replicas together (weights, cache and prompt caches, every model's ``num_instance``)
    exceed the total, the plan's ``host`` entry carries a warning with the sums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from router.placement.footprint import CPU
from router.placement.geometry import ModelGeometry
from router.placement.kv_layout import kv_cell_bytes, pad256
from router.placement.model_plan import ModelPlan

__all__ = [
    "CRAM_MAX_MIB",
    "CRAM_MIN_MIB",
    "SLOT_CONTEXTS_KEPT",
    "SequenceCost",
    "auto_cram_mib",
    "host_summary",
    "sequence_cost",
    "size_prompt_caches",
]

MiB = 1 << 20
GiB = 1 << 30
SLOT_CONTEXTS_KEPT = 2
CRAM_MIN_MIB = 256
CRAM_MAX_MIB = 8192
HOST_SHARE = 0.5  # of the host memory the plan leaves, what automatic prompt caches may take together


@attrs.frozen
class SequenceCost:
    """Bytes one cached sequence costs: ``per_token`` for each token in full-attention layers,
    ``window_per_cell`` for each of at most ``window_cells`` tokens in sliding-window layers, and
    ``fixed`` recurrent state."""

    per_token: int
    window_cells: int = 0
    window_per_cell: int = 0
    fixed: int = 0

    def bytes_at(self, tokens: int) -> int:
        """The state of a sequence of ``tokens`` tokens."""
        n = max(0, tokens)
        return self.per_token * n + self.window_per_cell * min(n, self.window_cells) + self.fixed


def sequence_cost(
    geometry: ModelGeometry,
    *,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    ubatch: int = 512,
    swa_full: bool = False,
) -> SequenceCost:
    """What one sequence's state costs in this model (see the module docstring)."""
    per_token = window = fixed = 0
    for layer in geometry.layers:
        cell = kv_cell_bytes(layer, cache_type_k, cache_type_v)
        if layer.sliding and not swa_full:
            window += cell
        else:
            per_token += cell
        fixed += 4 * layer.recurrent_floats
    cells = pad256(geometry.n_swa + ubatch) if window and geometry.n_swa > 0 else 0
    return SequenceCost(per_token=per_token, window_cells=cells, window_per_cell=window, fixed=fixed)


def auto_cram_mib(slot_state_bytes: int) -> int:
    """Room for SLOT_CONTEXTS_KEPT full slot contexts, in MiB, clamped to CRAM_MIN_MIB..CRAM_MAX_MIB."""
    wanted = -(-SLOT_CONTEXTS_KEPT * max(0, slot_state_bytes) // MiB)
    return max(CRAM_MIN_MIB, min(CRAM_MAX_MIB, wanted))


def _host_part(plan: ModelPlan) -> int:
    """Bytes one replica keeps in host memory besides its prompt cache."""
    if any(row.device == CPU for row in plan.rows):
        return sum(row.total for row in plan.rows if row.device == CPU) + plan.host_bytes
    return plan.host_bytes


def _counted(plan: ModelPlan) -> bool:
    """Whether the model's replicas may start (a refused model never does)."""
    return plan.verdict != "refused"


def size_prompt_caches(
    plans: Sequence[ModelPlan], configured: Mapping[str, int | None], host_total: int | None
) -> list[ModelPlan]:
    """``plans`` with ``cram_mib`` and ``cram_source`` set: the configured figure (``"config"``), else the
    automatic one (``"auto"``), capped by the host's share (``"host"``) when the host total is known.
    A model without a prediction gets CRAM_MIN_MIB unless configured."""
    auto = [p for p in plans if configured.get(p.name) is None and _counted(p)]
    cap: int | None = None
    if host_total is not None:
        kept = sum(_host_part(p) * p.num_instance for p in plans if _counted(p))
        replicas = sum(p.num_instance for p in auto)
        spare = int(max(0, host_total - kept) * HOST_SHARE)
        cap = spare // max(1, replicas) // MiB
    out = []
    for plan in plans:
        mib = configured.get(plan.name)
        source = "config"
        if mib is None:
            mib = auto_cram_mib(plan.slot_state_bytes) if plan.slot_state_bytes else CRAM_MIN_MIB
            source = "auto"
            if cap is not None and mib > cap:
                mib, source = cap, "host"
        out.append(attrs.evolve(plan, cram_mib=mib, cram_source=source))
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def host_summary(plans: Sequence[ModelPlan], host_total: int | None) -> dict[str, Any]:
    """The plan document's ``host`` entry: what every model's replicas together may keep in host memory.

    ``total_bytes`` the host's memory (null: unknown); ``need_bytes`` the sum over ``models``, each with
    ``name``, ``replicas``, ``host_bytes`` (per replica, besides the prompt cache), ``cram_bytes`` (per
    replica) and ``need_bytes`` (all its replicas); ``warning`` the sums when the need exceeds the total,
    else null. Refused models are left out: they never start.
    """
    models = []
    for plan in plans:
        if not _counted(plan):
            continue
        host = _host_part(plan)
        cram = (plan.cram_mib or 0) * MiB
        models.append(
            {
                "name": plan.name,
                "replicas": plan.num_instance,
                "host_bytes": host,
                "cram_bytes": cram,
                "need_bytes": (host + cram) * plan.num_instance,
            }
        )
    need = sum(m["need_bytes"] for m in models)
    warning = None
    if host_total is not None and need > host_total:
        parts = "; ".join(
            f"{m['name']} {m['replicas']} x ({_gib(m['host_bytes'])} + prompt cache {_gib(m['cram_bytes'])})"
            for m in models
            if m["need_bytes"]
        )
        warning = (
            f"host memory: all replicas together may keep ~{_gib(need)} GiB in host memory ({parts}) but "
            f"the host has {_gib(host_total)} GiB: lower `cram` (0 turns the prompt cache off) or "
            "num_instance, or run fewer models on the CPU"
        )
    return {"total_bytes": host_total, "need_bytes": need, "models": models, "warning": warning}
