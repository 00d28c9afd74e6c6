"""The GPU machine: nvidia-smi queries, the checks before a GPU run, and the CUDA llama-server build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from scripts.calibrate.errors import RunFailed, Unavailable
from scripts.calibrate.parsing import parse_compute_apps, parse_gpus

ROOT = Path(__file__).resolve().parents[2]
SMI_TIMEOUT = 30.0


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
