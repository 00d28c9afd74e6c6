"""The printed tables of a finished run and its JSON document."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.results import print_table
from scripts.calibrate.compare import _mib


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
