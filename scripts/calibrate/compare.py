"""The plan's prediction for GPU 0 against what llama-server logged and nvidia-smi measured, and the checks
that decide a run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scripts.calibrate.parsing import device_sums, host_weights

MiB = 1 << 20


def _gpu0_row(plan_model: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for row in plan_model.get("devices") or ():
        if row.get("device") == 0:
            return row
    return None


def _mib(n: int | float | None) -> float | None:
    return None if n is None else round(n / MiB, 2)


def compare_replica(
    plan_model: Mapping[str, Any],
    replica: Mapping[str, Any],
    buffers: Mapping[str, Mapping[str, float]],
    *,
    dry_run: bool,
    process_mib: int | None,
    gpu_delta_mib: int | None,
) -> dict[str, Any]:
    """One replica: the plan's bytes on GPU 0 against the logged buffers and the measured memory (MiB)."""
    row = _gpu0_row(plan_model) or {}
    predicted = {
        "weights": _mib(row.get("weights_bytes")),
        "kv": _mib((row.get("kv_bytes") or 0) + (row.get("recurrent_bytes") or 0)) if row else None,
        "compute": _mib(row.get("compute_bytes")),
        "reserve": _mib(row.get("reserve_bytes")),
        "total": _mib(row.get("total_bytes")),
        "need": _mib((plan_model.get("need_by_gpu") or {}).get("0")),
        "host": _mib(plan_model.get("host_bytes")),
    }
    parts = [predicted["weights"], predicted["kv"], predicted["compute"]]
    predicted["buffers"] = round(sum(p for p in parts if p is not None), 2) if row else None
    sums = device_sums(buffers, dry_run)
    logged = None
    if sums is not None:
        has_kv = "KV" in sums or "RS" in sums
        logged = {
            "weights": sums.get("model"),
            "kv": round(sums.get("KV", 0.0) + sums.get("RS", 0.0), 2) if has_kv else None,
            "compute": sums.get("compute"),
        }
        logged["buffers"] = round(sum(v for v in logged.values() if v is not None), 2)
        # In a dry run the one CPU model buffer holds the host part too; on a GPU it is apart.
        logged["host"] = None if dry_run else host_weights(buffers)
    measured = process_mib if process_mib is not None else gpu_delta_mib
    need = predicted["need"]
    known = measured is not None and need is not None
    return {
        "model": plan_model.get("name"),
        "replica": replica.get("id"),
        "pid": replica.get("pid"),
        "verdict": plan_model.get("verdict"),
        "ctx": plan_model.get("ctx"),
        "ctx_per_slot": plan_model.get("ctx_per_slot"),
        "parallel": plan_model.get("parallel"),
        "predicted_mib": predicted,
        "logged_mib": logged,
        "logged_buffers_mib": {d: dict(k) for d, k in buffers.items()},
        "buffers_error_pct": _pct(predicted["buffers"], logged["buffers"] if logged else None),
        "nvidia_smi_process_mib": process_mib,
        "gpu_used_delta_mib": gpu_delta_mib,
        "measured_mib": measured,
        "outside_buffers_mib": (
            None if measured is None or logged is None else round(measured - logged["buffers"], 2)
        ),
        "need_minus_measured_mib": round(need - measured, 2) if known else None,
        "need_covers_measured": need >= measured if known else None,
    }


def _pct(estimate: float | None, actual: float | None) -> float | None:
    if estimate is None or not actual:
        return None
    return round(100.0 * (estimate - actual) / actual, 2)


def checks_of(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Pass/fail checks of a finished run: the reload kept every context; on a GPU, every replica logged
    CUDA0 buffers and its predicted need covers what nvidia-smi measured."""
    checks = []
    reload = document["reload"]
    changed = [m for m, c in reload["ctx"].items() if c["before"] != c["after"]]
    checks.append(
        {
            "check": "reload keeps contexts",
            "ok": reload["status"] == 200 and not changed,
            "detail": f"HTTP {reload['status']}; changed: {', '.join(changed) or 'none'}; "
            f"restarted: {', '.join(reload.get('restarted') or []) or 'none'}",
        }
    )
    if document["mode"] == "gpu":
        for row in document["replicas"]:
            checks.append(
                {
                    "check": f"{row['model']}: CUDA0 buffers logged",
                    "ok": row["logged_mib"] is not None,
                    "detail": "" if row["logged_mib"] else "none found: is the binary a CUDA build?",
                }
            )
            measured = row["measured_mib"]
            checks.append(
                {
                    "check": f"{row['model']}: need covers measured",
                    "ok": row["need_covers_measured"] is True,
                    "detail": f"need {row['predicted_mib']['need']} MiB, measured {measured} MiB"
                    if measured is not None
                    else "no reading: nvidia-smi showed neither the pid nor a rise in used memory",
                }
            )
    return checks
