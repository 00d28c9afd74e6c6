"""One calibration run: the router on the models under test, a load of each, the readings per replica, and
``POST /reload`` with the models resident."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

from benchmarks.results import machine_facts
from benchmarks.services import router_process, work_directory
from scripts.calibrate.compare import checks_of, compare_replica
from scripts.calibrate.errors import RunFailed
from scripts.calibrate.machine import gpu0_used, query_compute_apps, query_gpus
from scripts.calibrate.parsing import context_lines, parse_buffers
from scripts.calibrate.subjects import Subject, model_files

LOAD_TIMEOUT = 120.0
RELOAD_SETTLE_TIMEOUT = 60.0
DRY_RUN_GPU_MIB = 8192  # GPU 0 declared to the router in a dry run


def _get(client: httpx.Client, path: str) -> Any:
    response = client.get(path)
    response.raise_for_status()
    return response.json()


def _replica_log(client: httpx.Client, replica: int) -> str:
    """Everything replica ``replica`` printed so far: its log file, through the router."""
    response = client.get(f"/logs/{replica}")
    response.raise_for_status()
    return response.text


def _chat(client: httpx.Client, model: str) -> float:
    started = time.monotonic()
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    response = client.post("/v1/chat/completions", json=body, timeout=LOAD_TIMEOUT + 60.0)
    if response.status_code != 200:
        raise RunFailed(f"chat request to {model} answered {response.status_code}: {response.text[:2000]}")
    return round(time.monotonic() - started, 2)


def _settle(client: httpx.Client, timeout: float) -> dict[str, Any]:
    """/status once no replica is loading or stopping (at most ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        status = _get(client, "/status")
        if all(r["state"] in ("ready", "draining") for r in status["replicas"]):
            return status
        if time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def _contexts(client: httpx.Client) -> dict[str, Any]:
    return {m["id"]: m.get("ctx") for m in _get(client, "/v1/models")["data"] if "pool" not in m}


def _pids(status: Mapping[str, Any]) -> dict[str, list[int | None]]:
    pids: dict[str, list[int | None]] = {}
    for replica in status["replicas"]:
        pids.setdefault(replica["model"], []).append(replica.get("pid"))
    return pids


def _plan_devices(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    keys = ("id", "name", "bus_id", "total_bytes", "budget_bytes", "available_bytes", "foreign_bytes",
            "ours_bytes", "declared_bytes", "source")  # fmt: skip
    return [{k: d.get(k) for k in keys} for d in plan.get("devices", [])]


def reload_check(
    client: httpx.Client, plan: Mapping[str, Any], status: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST /reload with the models resident; the plan after it, and contexts and pids before and after.

    The config file is unchanged, so every context must stay: a budget that counted the router's own
    replicas as another process's memory would shrink an automatic context here.
    """
    ctx_before, pids_before = _contexts(client), _pids(status)
    response = client.post("/reload", json={}, timeout=60.0)
    is_json = response.headers.get("content-type", "").startswith("application/json")
    reply = response.json() if is_json else {"text": response.text[:2000]}
    status_after = _settle(client, RELOAD_SETTLE_TIMEOUT)
    plan_after = _get(client, "/plan")
    ctx_after, pids_after = _contexts(client), _pids(status_after)
    plan_ctx_before = {m["name"]: m.get("ctx") for m in plan["models"]}
    plan_ctx_after = {m["name"]: m.get("ctx") for m in plan_after["models"]}
    reload = {
        "status": response.status_code,
        "reply": reply,
        "restarted": reply.get("restarted"),
        "ctx": {
            name: {
                "before": ctx_before.get(name),
                "after": ctx_after.get(name),
                "plan_before": plan_ctx_before.get(name),
                "plan_after": plan_ctx_after.get(name),
                "pids_before": pids_before.get(name, []),
                "pids_after": pids_after.get(name, []),
            }
            for name in ctx_before
        },
        "devices_before": _plan_devices(plan),
        "devices_after": _plan_devices(plan_after),
    }
    return plan_after, reload


def calibrate(args: argparse.Namespace, binary: Path, subjects: Sequence[Subject]) -> dict[str, Any]:
    dry_run = bool(args.cpu_dry_run)
    started = time.monotonic()
    document: dict[str, Any] = {
        "name": "gpu-calibration",
        "mode": "cpu-dry-run" if dry_run else "gpu",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_facts(binary),
    }
    smi: dict[str, Any] = {"gpus_before": None if dry_run else query_gpus()}
    document["nvidia_smi"] = smi
    files = model_files(args.models_dir, subjects)
    document["models"] = {
        s.name: {"path": str(files[s.name]), "shape": attrs.asdict(s.shape), "config": dict(s.table)}
        for s in subjects
    }
    tables = {s.name: {"model": str(files[s.name]), "gpus": [0], **s.table} for s in subjects}
    threads = max(1, min(8, os.cpu_count() or 1))
    with (
        work_directory(args.keep) as work,
        router_process(
            work,
            tables,
            router={"max_models_per_gpu": 2, "load_timeout": LOAD_TIMEOUT, "stop_timeout": 10.0},
            devices={0: DRY_RUN_GPU_MIB} if dry_run else None,
            defaults={"threads": threads, "log-verbosity": 4},
            binary=binary,
        ) as service,
        httpx.Client(base_url=service.url, timeout=30.0) as client,
    ):
        plan = _get(client, "/plan")
        document["plan"] = plan
        loads = []
        for subject in subjects:
            before = gpu0_used(dry_run)
            seconds = _chat(client, subject.name)
            after = gpu0_used(dry_run)
            delta = None if before is None or after is None else after - before
            loads.append({"model": subject.name, "seconds": seconds, "gpu_used_delta_mib": delta})
        document["loads"] = loads
        status = _settle(client, RELOAD_SETTLE_TIMEOUT)
        smi["gpus_loaded"] = None if dry_run else query_gpus()
        apps = {} if dry_run else query_compute_apps()
        smi["compute_apps"] = {str(pid): mib for pid, mib in apps.items()}
        by_name = {m["name"]: m for m in plan["models"]}
        deltas = {load["model"]: load["gpu_used_delta_mib"] for load in loads}
        rows = []
        for replica in status["replicas"]:
            log = _replica_log(client, replica["id"])
            row = compare_replica(
                by_name[replica["model"]],
                replica,
                parse_buffers(log),
                dry_run=dry_run,
                process_mib=apps.get(replica["pid"]),
                gpu_delta_mib=deltas.get(replica["model"]),
            )
            row["logged_context"] = context_lines(log)
            rows.append(row)
        document["replicas"] = rows

        document["plan_after_reload"], document["reload"] = reload_check(client, plan, status)
    document["checks"] = checks_of(document)
    document["ok"] = all(c["ok"] for c in document["checks"])
    document["elapsed_s"] = round(time.monotonic() - started, 1)
    return document
