"""Parsing what the run reads: a replica's log (buffer sizes, context lines) and nvidia-smi's CSV output."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# "load_tensors:        CUDA0 model buffer size =   483.49 MiB" (also KV, RS, compute and output buffers)
BUFFER_RE = re.compile(r"\b(\S+)\s+(model|KV|RS|compute|output) buffer size\s*=\s*([0-9.]+) MiB")
CONTEXT_RE = re.compile(r"\bn_ctx(?:_seq)?\s+=\s+\d+")


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
