"""The words of a placement verdict: what each device needs against its budget, and which operator
settings made a verdict "override" (with what each moved to host memory). ``router.placement.fit`` puts
them together.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.placement.extras import Extras, HostTensors
from router.placement.model_plan import DeviceRow, PlacementInput

__all__ = ["gib", "operator_settings", "over_budget", "override_message", "shortfall"]

MiB = 1 << 20
GiB = 1 << 30


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f}"


def over_budget(rows: Sequence[DeviceRow], replicas: int) -> list[DeviceRow]:
    """Rows whose replicas together exceed a known budget."""
    return [r for r in rows if r.budget is not None and r.total * replicas > r.budget]


def _breakdown(row: DeviceRow, ctx: int) -> str:
    parts = [f"weights {gib(row.weights)}", f"KV at {ctx} ctx {gib(row.kv)}"]
    if row.recurrent:
        parts.append(f"recurrent state {gib(row.recurrent)}")
    parts += [f"compute {gib(row.compute)}", f"reserve {gib(row.reserve)}"]
    text = " + ".join(parts)
    inside = [f"draft model {gib(row.draft)}"] if row.draft else []
    inside += [f"projector {gib(row.projector)}"] if row.projector else []
    return f"{text}; of which {', '.join(inside)}" if inside else text


def shortfall(name: str, rows: Sequence[DeviceRow], ctx: int, replicas: int) -> str:
    """'NAME needs ~X GiB on GPU 0 (weights ... + reserve ...) but GPU 0 has Y GiB' for each device over."""
    clauses = []
    for row in rows:
        if replicas > 1:
            need = (
                f"{replicas} replicas need ~{gib(row.total * replicas)} GiB on {row.label} "
                f"({gib(row.total)} each: {_breakdown(row, ctx)})"
            )
        else:
            need = f"~{gib(row.total)} GiB on {row.label} ({_breakdown(row, ctx)})"
            need = f"needs {need}"
        clauses.append(f"{need} but {row.label} has {gib(row.budget)} GiB")
    return f"{name} " + "; ".join(clauses)


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def operator_settings(inp: PlacementInput, extras: Extras, cpu_only: bool) -> list[str]:
    """The operator's settings that make a verdict "override", each saying what it moved to the host.

    A model that runs on the CPU alone moves nothing: only its ``ctx`` counts there.
    """
    given = [f"ctx={inp.ctx}"] if inp.ctx is not None else []
    if cpu_only:
        return given
    if inp.gpu_layers is not None:
        given.append(f"gpu_layers={inp.gpu_layers}")
    if inp.host_patterns:
        given.append(_moved(inp.host_flags, extras.host, "weights"))
    if not inp.kv_offload:
        given.append("--no-kv-offload (the KV cache and recurrent state in host memory)")
    if inp.mmproj is not None and not inp.mmproj_offload:
        weights = extras.projector.weights if extras.projector is not None else 0
        given.append(f"--no-mmproj-offload (the projector's {_size(weights)} in host memory)")
    draft = inp.draft
    if draft is not None and extras.draft is not None:
        slots = extras.draft.n_layer + 1
        if draft.gpu_layers is not None and draft.gpu_layers < slots:
            on_cpu = slots - max(draft.gpu_layers, 0)
            given.append(f"gpu-layers-draft={draft.gpu_layers} ({on_cpu} of {slots} draft layers on the CPU)")
        if draft.host_patterns:
            given.append(_moved(draft.host_flags, extras.draft_host, "draft weights"))
    return given


def _moved(flags: Sequence[str], host: HostTensors | None, what: str) -> str:
    text = " ".join(flags) or "tensor overrides"
    if host is None or not host.count:
        return f"{text} (matches no tensor: nothing moved)"
    return f"{text} (keeps {host.count} tensors, {_size(host.total)} of {what}, in host memory)"


def override_message(
    inp: PlacementInput, given: Sequence[str], rows: Sequence[DeviceRow], ctx: int, replicas: int
) -> str:
    over = over_budget(rows, replicas)
    head = f"{inp.name}: operator setting {', '.join(given)} used as given"
    if not over:
        return head + "; predicted: " + "; ".join(f"{r.label} ~{gib(r.total)} GiB" for r in rows)
    sums = "; ".join(
        f"predicted {gib(r.total * replicas)} GiB over budget {gib(r.budget)} GiB on {r.label}" for r in over
    )
    return (
        f"{head}; override: {sums} ({shortfall(inp.name, over, ctx, replicas)}). It loads anyway and "
        "takes the whole GPU; only a real out-of-memory at load fails it"
    )
