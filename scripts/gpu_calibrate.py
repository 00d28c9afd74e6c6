"""Compare the router's memory plan with what llama-server really takes on an NVIDIA GPU.

Run it through ``scripts/gpu-calibrate``. Steps:

1. build a CUDA llama-server from the same sdist as the CPU one (``LLAMA_ROUTER_CUDA=1
   scripts/install-llama-server``; skipped with ``--llama-server PATH``);
2. write two random-weight models with the layer shapes of real ones (kept for later runs in
   ``calibration-models/`` of the router's home, ``~/.cache/llama-router`` by default);
3. start ``python -m router`` with both on GPU 0 (one with the automatic context and two slots, one with an
   operator ``ctx``), load each with one chat request, and compare, per replica, the plan's prediction for
   GPU 0 with llama-server's own logged CUDA0 buffer sizes and with the memory nvidia-smi reports for the
   replica's process (and the rise of the GPU's used memory during its load); then ``POST /reload`` with
   both resident and check that the contexts stay the same;
4. print tables and write ``outputs/gpu-calibration.json``.

Exit status: 0 when every check passed, 1 when a check failed or the run broke, 2 when this machine cannot
run it (no nvidia-smi, no GPU, no nvcc to build with). ``--cpu-dry-run`` runs steps 2-4 with the CPU
build and its CPU buffers instead, so the script itself can be checked on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results import machine_facts, print_table  # noqa: E402
from benchmarks.services import router_process, work_directory  # noqa: E402
from router.cli.tinymodel import TinyShape, write_tiny_model  # noqa: E402
from router.hosts.locate import INSTALL_COMMAND, LlamaServerNotFound, find_llama_server, router_home  # noqa: E402

MiB = 1 << 20
OUTPUT = ROOT / "outputs" / "gpu-calibration.json"
SMI_TIMEOUT = 30.0
LOAD_TIMEOUT = 120.0
RELOAD_SETTLE_TIMEOUT = 60.0
DRY_RUN_GPU_MIB = 8192  # GPU 0 declared to the router in a dry run
# "load_tensors:        CUDA0 model buffer size =   483.49 MiB" (also KV, RS, compute and output buffers)
BUFFER_RE = re.compile(r"\b(\S+)\s+(model|KV|RS|compute|output) buffer size\s*=\s*([0-9.]+) MiB")
CONTEXT_RE = re.compile(r"\bn_ctx(?:_seq)?\s+=\s+\d+")


class Unavailable(RuntimeError):
    """This machine cannot run the calibration (exit status 2)."""


class RunFailed(RuntimeError):
    """The calibration started but could not finish (exit status 1)."""


@attrs.frozen
class Subject:
    """One model under test: its router name, its shape and its extra config keys (``ctx``, ``parallel``)."""

    name: str
    shape: TinyShape
    table: Mapping[str, Any]


# Real layer shapes and vocabularies; weights random. "qwen": Qwen2.5-0.5B (tied output, as the real one);
# "llama": Llama-3.2-1B with its own output layer (the real one ties it), so both layouts are measured.
REAL_SUBJECTS = (
    Subject(
        "qwen-shape",
        TinyShape(
            n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864, n_ctx_train=32768,
            dtype="f16", vocab="qwen2", tie_output=True,
        ),
        {"parallel": 2},
    ),
    Subject(
        "llama-shape",
        TinyShape(
            n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, n_ctx_train=131072,
            dtype="q8_0", vocab="llama-bpe",
        ),
        {"ctx": 16384},
    ),
)  # fmt: skip
# The same layouts, tiny: a quick check of the script itself (--small-models).
SMALL_SUBJECTS = (
    Subject(
        "qwen-shape",
        TinyShape(
            n_embd=128, n_layer=3, n_head=4, n_head_kv=2, n_ff=384, n_ctx_train=4096,
            dtype="f16", tie_output=True,
        ),
        {"parallel": 2},
    ),
    Subject(
        "llama-shape",
        TinyShape(n_embd=256, n_layer=2, n_head=8, n_head_kv=2, n_ff=768, n_ctx_train=8192, dtype="q8_0"),
        {"ctx": 4096},
    ),
)  # fmt: skip


# ------------------------------------------------------------------------------------------ parsing


def parse_buffers(log: str) -> dict[str, dict[str, float]]:
    """MiB per buffer device and kind in one replica's log (``GET /logs/{replica}``, its log file).

    Several lines of one device and kind (one KV buffer per layer group, say) are summed.
    """
    sizes: dict[str, dict[str, float]] = {}
    for line in log.splitlines():
        for device, kind, mib in BUFFER_RE.findall(line):
            kinds = sizes.setdefault(device, {})
            kinds[kind] = round(kinds.get(kind, 0.0) + float(mib), 2)
    return sizes


def context_lines(log: str) -> list[str]:
    """The ``n_ctx`` / ``n_ctx_seq`` lines in one replica's log (what llama.cpp really allocated)."""
    return [
        " ".join(line.split())
        for line in log.splitlines()
        if "llama_context" in line and CONTEXT_RE.search(line)
    ]


def device_sums(buffers: Mapping[str, Mapping[str, float]], dry_run: bool) -> dict[str, float] | None:
    """Buffer MiB per kind on GPU 0 as the replica sees it (``CUDA0``), or on the CPU in a dry run."""
    wanted = [d for d in buffers if (d.startswith("CPU") if dry_run else d == "CUDA0")]
    if not wanted:
        return None
    sums: dict[str, float] = {}
    for device in wanted:
        for kind, mib in buffers[device].items():
            sums[kind] = sums.get(kind, 0.0) + mib
    return sums


def host_weights(buffers: Mapping[str, Mapping[str, float]]) -> float | None:
    """MiB of model buffers a GPU replica keeps in host memory (``CPU_Mapped``, ``CUDA_Host``: the token
    embeddings, normally)."""
    sizes = [k["model"] for d, k in buffers.items() if "model" in k and (d.startswith("CPU") or "_Host" in d)]
    return round(sum(sizes), 2) if sizes else None


def _mib_or_none(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) if re.fullmatch(r"[0-9.]+", text) else None


def parse_gpus(csv: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,memory.used
    --format=csv,noheader,nounits``."""
    gpus = []
    for line in csv.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        gpus.append(
            {
                "index": int(cells[0]),
                "name": cells[1],
                "bus_id": cells[2],
                "total_mib": _mib_or_none(cells[3]),
                "used_mib": _mib_or_none(cells[4]),
            }
        )
    return gpus


def parse_compute_apps(csv: str) -> dict[int, int | None]:
    """pid -> used MiB from ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``
    (None where the driver says ``[N/A]``)."""
    apps: dict[int, int | None] = {}
    for line in csv.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit():
            apps[int(cells[0])] = _mib_or_none(cells[1])
    return apps


# ------------------------------------------------------------------------------------------ comparing


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


# ------------------------------------------------------------------------------------------ the machine


def nvidia_smi(*args: str) -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=SMI_TIMEOUT, check=False
        )
    except FileNotFoundError as exc:
        raise Unavailable("nvidia-smi is not on PATH: this needs an NVIDIA GPU and its driver") from exc
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(f"nvidia-smi {' '.join(args)} did not answer within {SMI_TIMEOUT:g} s") from exc
    if done.returncode != 0:
        raise Unavailable(f"nvidia-smi {' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def query_gpus() -> list[dict[str, Any]]:
    fields = "index,name,pci.bus_id,memory.total,memory.used"
    return parse_gpus(nvidia_smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits"))


def query_compute_apps() -> dict[int, int | None]:
    return parse_compute_apps(
        nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    )


def gpu0_used(dry_run: bool) -> int | None:
    if dry_run:
        return None
    gpus = [g for g in query_gpus() if g["index"] == 0]
    return gpus[0]["used_mib"] if gpus else None


def find_nvcc() -> str | None:
    fallback = "/usr/local/cuda/bin/nvcc"
    return (
        os.environ.get("CUDACXX")
        or shutil.which("nvcc")
        or (fallback if os.access(fallback, os.X_OK) else None)
    )


def preflight_gpu(build: bool) -> None:
    """:class:`Unavailable` without nvidia-smi, without a GPU, or without nvcc when a build is needed."""
    if shutil.which("nvidia-smi") is None:
        raise Unavailable(
            "nvidia-smi is not on PATH: this needs a machine with an NVIDIA GPU and its driver "
            "(--cpu-dry-run checks the script on the CPU)"
        )
    if not query_gpus():
        raise Unavailable("nvidia-smi lists no GPU")
    if build and find_nvcc() is None:
        raise Unavailable(
            "nvcc (the CUDA toolkit) is needed to build a CUDA llama-server: put it on PATH or set CUDACXX, "
            "or pass --llama-server PATH of a CUDA build"
        )


def build_cuda_server() -> Path:
    """``LLAMA_ROUTER_CUDA=1 scripts/install-llama-server``: builds once, then returns the installed path."""
    script = ROOT / "scripts" / "install-llama-server"
    print("building (or finding) the CUDA llama-server; the first build takes a while", file=sys.stderr)
    done = subprocess.run(
        [str(script)], env={**os.environ, "LLAMA_ROUTER_CUDA": "1"}, stdout=subprocess.PIPE, text=True
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RunFailed(f"{script} with LLAMA_ROUTER_CUDA=1 failed (exit status {done.returncode})")
    return Path(lines[-1])


def model_files(directory: Path, subjects: Sequence[Subject]) -> dict[str, Path]:
    """Each subject's model file, written once per shape (the name carries a digest of the shape)."""
    paths = {}
    for subject in subjects:
        digest = hashlib.sha256(repr(attrs.astuple(subject.shape)).encode()).hexdigest()[:12]
        path = directory / f"{subject.name}-{digest}.gguf"
        if not path.is_file():
            started = time.monotonic()
            write_tiny_model(path, subject.shape)
            print(f"wrote {path} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        paths[subject.name] = path
    return paths


# ------------------------------------------------------------------------------------------ the run


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


# ------------------------------------------------------------------------------------------ output


def _pair(predicted: float | None, logged: float | None) -> str:
    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    return f"{cell(predicted)} / {cell(logged)}"


def report(document: Mapping[str, Any]) -> None:
    dry = document["mode"] != "gpu"
    smi_gpus = {g["index"]: g for g in document["nvidia_smi"].get("gpus_before") or []}
    rows = []
    for device in document["reload"]["devices_before"]:
        gpu = smi_gpus.get(device["id"]) or {}
        rows.append(
            [
                f"GPU {device['id']}" if isinstance(device["id"], int) else str(device["id"]),
                gpu.get("name") or device.get("name") or "-",
                gpu.get("bus_id") or device.get("bus_id") or "-",
                gpu.get("total_mib"),
                gpu.get("used_mib"),
                _mib(device["budget_bytes"]),
                _mib(device["available_bytes"]),
                _mib(device["foreign_bytes"]),
                device["source"],
            ]
        )
    print_table(
        "Devices at start (MiB): nvidia-smi, then the router's /plan",
        ["device", "name", "bus id", "total", "used", "budget", "available", "foreign", "source"],
        rows,
    )
    where = "CPU buffers in this dry run, whose model buffer also holds the host part" if dry else "CUDA0"
    print_table(
        f"Buffers on GPU 0, predicted / logged by llama-server ({where}), MiB",
        ["model", "ctx", "slots", "weights", "KV", "compute", "sum", "error %", "host weights"],
        [
            [
                r["model"],
                r["ctx"],
                r["parallel"],
                _pair(r["predicted_mib"]["weights"], (r["logged_mib"] or {}).get("weights")),
                _pair(r["predicted_mib"]["kv"], (r["logged_mib"] or {}).get("kv")),
                _pair(r["predicted_mib"]["compute"], (r["logged_mib"] or {}).get("compute")),
                _pair(r["predicted_mib"]["buffers"], (r["logged_mib"] or {}).get("buffers")),
                r["buffers_error_pct"],
                _pair(r["predicted_mib"]["host"], (r["logged_mib"] or {}).get("host")),
            ]
            for r in document["replicas"]
        ],
    )
    print_table(
        "Whole replica on GPU 0 (MiB): the plan's need vs nvidia-smi",
        ["model", "pid", "reserve", "need", "nvidia-smi pid", "GPU used rise", "outside buffers",
         "need - measured", "covered"],
        [
            [r["model"], r["pid"], r["predicted_mib"]["reserve"], r["predicted_mib"]["need"],
             r["nvidia_smi_process_mib"], r["gpu_used_delta_mib"], r["outside_buffers_mib"],
             r["need_minus_measured_mib"], r["need_covers_measured"]]
            for r in document["replicas"]
        ],
    )  # fmt: skip
    print_table(
        "POST /reload with the models resident",
        ["model", "ctx before", "ctx after", "plan before", "plan after", "pids before", "pids after"],
        [
            [name, c["before"], c["after"], c["plan_before"], c["plan_after"],
             ",".join(map(str, c["pids_before"])), ",".join(map(str, c["pids_after"]))]
            for name, c in document["reload"]["ctx"].items()
        ],
    )  # fmt: skip
    after = {d["id"]: d for d in document["reload"]["devices_after"]}
    for before in document["reload"]["devices_before"]:
        now = after.get(before["id"], {})
        figures = [
            f"{key.removesuffix('_bytes')} {_pair(_mib(before.get(key)), _mib(now.get(key)))}"
            for key in ("budget_bytes", "available_bytes", "foreign_bytes", "ours_bytes")
        ]
        name = f"GPU {before['id']}" if isinstance(before["id"], int) else str(before["id"])
        print(f"{name} in /plan before / after the reload (MiB): " + ", ".join(figures) + "\n")
    print_table(
        "Checks",
        ["check", "result", "detail"],
        [[c["check"], "pass" if c["ok"] else "FAIL", c["detail"]] for c in document["checks"]],
    )


def write_document(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


# ------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-calibrate",
        description="Compare the router's memory plan with what llama-server takes on GPU 0 (CUDA).",
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="use the CPU build and its CPU buffers (no GPU needed; nvidia-smi columns stay empty)",
    )
    parser.add_argument("--llama-server", type=Path, help="use this llama-server instead of building one")
    parser.add_argument(
        "--small-models", action="store_true", help="tiny widths instead of the real shapes (a quick check)"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=router_home() / "calibration-models",
        help="where the generated models are kept between runs (default: %(default)s)",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help="JSON result (default: %(default)s)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (config, router and replica logs)"
    )
    return parser


@contextlib.contextmanager
def stop_on_signals(received: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM end the run through the normal clean-up, which stops the router and its replicas.

    Each signal is noted in ``received``: Ctrl-C in a terminal reaches the router too, and what it refuses
    while it drains is then part of the interruption, not a failure.
    """

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    subjects = SMALL_SUBJECTS if args.small_models else REAL_SUBJECTS
    received: list[int] = []
    try:
        with stop_on_signals(received):
            if args.cpu_dry_run:
                binary = find_llama_server(str(args.llama_server) if args.llama_server else None)
            else:
                preflight_gpu(build=args.llama_server is None)
                binary = args.llama_server or build_cuda_server()
            document = calibrate(args, binary, subjects)
    except (Unavailable, LlamaServerNotFound) as exc:
        hint = f" (the CPU build: {INSTALL_COMMAND})" if isinstance(exc, LlamaServerNotFound) else ""
        print(f"gpu-calibrate: cannot run here: {exc}{hint}", file=sys.stderr)
        return 2
    except (RuntimeError, httpx.HTTPError, OSError, KeyboardInterrupt) as exc:
        if received or isinstance(exc, KeyboardInterrupt):
            signum = received[0] if received else signal.SIGINT
            name = signal.Signals(signum).name
            print(f"gpu-calibrate: stopped by {name}; the router and its replicas are gone", file=sys.stderr)
            return 128 + signum
        print(f"gpu-calibrate: failed: {exc}", file=sys.stderr)
        return 1
    report(document)
    write_document(args.output, document)
    print(f"wrote {args.output}")
    print("all checks passed" if document["ok"] else "some checks FAILED")
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
