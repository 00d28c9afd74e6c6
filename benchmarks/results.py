"""Results of the benchmarks: statistics, the machine's facts, the JSON document and its Markdown tables,
the options every benchmark shares and the frame its main runs in."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from benchmarks.services import (
    ROOT,
    llama_server_binary,
    llama_server_version,
    router_process,
    work_directory,
)

OUTPUTS = ROOT / "outputs"


# --------------------------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, mean, min, p50, p90, p99 and max of ``values``."""
    return {
        "n": len(values),
        "mean": sum(values) / len(values) if values else None,
        "min": min(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


# ----------------------------------------------------------------------------------------------- output


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def machine_facts(binary: Path | None = None) -> dict[str, Any]:
    """CPU count, load, OS, Python and library versions, llama-server build, repository commit."""
    import trio

    facts: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "trio": trio.__version__,
        "commit": _git_commit(),
    }
    if binary is not None:
        facts["llama_server"] = str(binary)
        facts["llama_server_version"] = llama_server_version(binary)
    return facts


def write_result(name: str, document: Mapping[str, Any]) -> Path:
    """Write ``outputs/benchmark-<name>.json`` (creating ``outputs/``) and return its path."""
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    path = OUTPUTS / f"benchmark-{name}.json"
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: numbers rounded, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a Markdown table; cells go through :func:`fmt` unless already strings.

    The first column (a name) is left-aligned, the others (numbers) right-aligned.
    """
    cells = [[cell if isinstance(cell, str) else fmt(cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [f"### {title}", ""]
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("| " + " | ".join(padded) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    return text


def host_url(value: str) -> str:
    """``--host HOST[:PORT]`` as a URL: ``localhost:11434`` is ``http://localhost:11434``; a value that
    already has a scheme is kept. No trailing slash."""
    value = value.strip().rstrip("/")
    if not value:
        raise argparse.ArgumentTypeError("give a host, e.g. localhost:8080")
    return value if "://" in value else f"http://{value}"


def base_parser(description: str) -> argparse.ArgumentParser:
    """Options of every benchmark: ``--url`` (or ``--host``) of a running router, the binary, ``--keep``,
    ``--name``."""
    parser = argparse.ArgumentParser(description=description)
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--url", help="a running router (e.g. http://127.0.0.1:8080); default: start one on tiny models"
    )
    target.add_argument(
        "--host",
        dest="url",
        type=host_url,
        metavar="HOST[:PORT]",
        help="a running router as host and port (e.g. localhost:8080): the same as --url http://HOST[:PORT]",
    )
    parser.add_argument("--llama-server", help="llama-server binary (default: the router's lookup)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directory and logs")
    parser.add_argument("--name", help="result name: outputs/benchmark-NAME.json")
    return parser


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {key: value for key, value in vars(args).items() if key not in ("keep",)}


@attrs.frozen
class LocalRouter:
    """The router a benchmark starts for itself: its models, settings, declared GPUs (id -> MiB) and what the
    result document records about that set-up."""

    models: Mapping[str, Mapping[str, Any]]
    target: Mapping[str, Any]
    devices: Mapping[int, int]
    router: Mapping[str, Any] | None = None
    keys: Mapping[str, Any] | None = None


def run_benchmark(
    name: str,
    args: argparse.Namespace,
    benchmark: Callable[[str, argparse.Namespace], Awaitable[dict[str, Any]]],
    setup: Callable[[Path], LocalRouter],
    report: Callable[[dict[str, Any]], None],
) -> int:
    """Run ``benchmark`` against ``--url``, or against a router started on ``setup``'s models; print the
    report and write ``outputs/benchmark-<name>.json``."""
    document: dict[str, Any] = {"benchmark": name, "settings": settings_of(args)}
    if args.url:
        document["machine"] = machine_facts()
        document["target"] = {"url": args.url}
        result = trio.run(benchmark, args.url, args)
    else:
        binary = llama_server_binary(args.llama_server)
        document["machine"] = machine_facts(binary)
        with work_directory(args.keep) as work:
            local = setup(work)
            document["target"] = dict(local.target)
            with router_process(
                work, local.models, router=local.router, devices=local.devices, keys=local.keys, binary=binary
            ) as service:
                result = trio.run(benchmark, service.url, args)
    document["result"] = result
    report(result)
    path = write_result(args.name or name, document)
    print(f"wrote {path}")
    return 0
