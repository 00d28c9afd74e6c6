"""Shared helpers of the benchmarks that run the real llama-server: processes, requests, statistics, output.

The benchmarks run as scripts (``python benchmarks/bench_X.py``); each puts the repository root on
``sys.path`` and imports this module as ``benchmarks.common``. Everything listens on 127.0.0.1 only.

Processes started here (the router, a bare llama-server, llama.cpp's own router mode) are context managers
that wait for ``/health`` and stop their process (SIGTERM, then SIGKILL) when the block ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from router.cli.tinymodel import TinyShape, write_tiny_model  # noqa: E402
from router.hosts.locate import find_llama_server  # noqa: E402
from router.shell.ports import free_port  # noqa: E402

OUTPUTS = ROOT / "outputs"
READY_TIMEOUT = 90.0
# Memory declared for each GPU of a self-started router: room for the tiny models beside the router's
# default reserve of 512 MiB (residency caps, not memory, make the swaps).
DEVICE_MIB = 2048
ROUTER_ENV = frozenset(
    ("ROUTER_HOST", "ROUTER_PORT", "ROUTER_API_KEYS", "HISTORY_DB_PATH", "ROUTER_CONFIG_PATH")
)

# Word list for generated prompts: plain English words, most of them one or two tokens.
_WORD_TEXT = """
time person year way day thing man world life hand part child eye woman place work week case point
government company number group problem fact river garden window letter market table story music color
light water paper stone train cloud field night morning winter summer city house road bridge forest
mountain island ocean animal bird tree flower apple bread cheese coffee dinner friend family teacher
doctor student question answer reason idea system program network signal engine plane ship wheel
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class BenchmarkError(RuntimeError):
    """A process the benchmark needs did not start or a request went wrong beyond measuring."""


# ---------------------------------------------------------------------------------------------- processes


@attrs.frozen
class Service:
    """A started process that answers HTTP at ``url``; its output goes to ``log_path``."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(service: Service, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while True:
            if service.process.poll() is not None:
                raise BenchmarkError(
                    f"{service.name} exited with {service.process.returncode}:\n{service.log_tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{service.url}/health").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise BenchmarkError(f"{service.name} not healthy after {timeout:g} s:\n{service.log_tail()}")
            time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def run_service(
    name: str, argv: Sequence[str], url: str, log_path: Path, *, env: Mapping[str, str] | None = None
) -> Iterator[Service]:
    """Start ``argv``, wait until ``url/health`` answers 200, stop the process when the block ends.

    ``env`` replaces the environment (default: this process's).
    """
    full_env = dict(os.environ) if env is None else dict(env)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            list(argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=str(ROOT),
        )
    service = Service(name, url, process, log_path)
    try:
        _wait_healthy(service, READY_TIMEOUT)
        yield service
    finally:
        _stop(process)


def llama_server_binary(configured: str | None = None) -> Path:
    """The llama-server binary: ``configured``, else the router's own lookup (PATH, then the CPU build)."""
    return find_llama_server(configured)


def llama_server_version(binary: Path) -> str:
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    version = [line for line in lines if line.startswith("version:")]
    return (version or lines or ["unknown"])[0]


@contextlib.contextmanager
def router_process(
    work_dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[int, int] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    binary: Path | None = None,
) -> Iterator[Service]:
    """Run ``python -m router`` on a config generated from the arguments (``devices``: GPU id -> MiB).

    The config is written as ``work_dir/router.json``; replicas run with one thread unless ``defaults``
    says otherwise. The router listens on a free loopback port.
    """
    port = free_port()
    doc: dict[str, Any] = {
        "router": {
            "host": "127.0.0.1",
            "port": port,
            "llama_server": str(binary or llama_server_binary()),
            "history_db": str(work_dir / "history.db"),
            "replica_logs": str(work_dir / "replica-logs"),
            "load_timeout": 60.0,
            "stop_timeout": 5.0,
            "shutdown_grace": 2.0,
            **(router or {}),
        },
        "defaults": {"threads": 1, **(defaults or {})},
        "models": {name: dict(table) for name, table in models.items()},
    }
    if devices:
        doc["devices"] = {str(gpu): {"memory_mib": mib} for gpu, mib in devices.items()}
    if pools:
        doc["pools"] = dict(pools)
    config_path = work_dir / "router.json"
    config_path.write_text(json.dumps(doc, indent=2) + "\n")
    argv = [sys.executable, "-m", "router", "--config", str(config_path)]
    # The file decides; environment overrides of the operator's own router must not leak in.
    env = {key: value for key, value in os.environ.items() if key not in ROUTER_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with run_service("router", argv, f"http://127.0.0.1:{port}", work_dir / "router.log", env=env) as svc:
        yield svc


@contextlib.contextmanager
def llama_server_process(
    work_dir: Path,
    model: Path,
    *,
    ctx: int,
    slots: int,
    threads: int = 1,
    extra: Sequence[str] = (),
    binary: Path | None = None,
) -> Iterator[Service]:
    """A bare llama-server on ``model`` with the flags the router gives a CPU replica."""
    port = free_port()
    argv = [
        str(binary or llama_server_binary()),
        *("--host", "127.0.0.1", "--port", str(port), "-m", str(model)),
        *("-c", str(ctx), "-np", str(slots), "--fit", "off", "-t", str(threads)),
        *extra,
    ]
    log = work_dir / f"llama-server-{model.stem}-{port}.log"
    with run_service("llama-server", argv, f"http://127.0.0.1:{port}", log) as svc:
        yield svc


@contextlib.contextmanager
def llamacpp_router_process(
    work_dir: Path,
    models_dir: Path,
    *,
    models_max: int,
    ctx: int,
    slots: int,
    threads: int = 1,
    binary: Path | None = None,
) -> Iterator[Service]:
    """llama.cpp's own router mode: ``llama-server --models-dir DIR --models-max N``.

    Its children get the context, slot and thread flags given here; a request picks the model by the
    file name without ``.gguf`` in its ``model`` field.
    """
    port = free_port()
    argv = [
        str(binary or llama_server_binary()),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--models-dir", str(models_dir), "--models-max", str(models_max)),
        *("-c", str(ctx), "-np", str(slots), "-t", str(threads)),
    ]
    log = work_dir / f"llamacpp-router-{port}.log"
    with run_service("llama.cpp router", argv, f"http://127.0.0.1:{port}", log) as svc:
        yield svc


@contextlib.contextmanager
def work_directory(keep: bool = False) -> Iterator[Path]:
    """A temporary directory for configs, models and logs (kept, and named, when ``keep``)."""
    if keep:
        path = Path(tempfile.mkdtemp(prefix="llama-router-bench-"))
        print(f"work directory: {path}", file=sys.stderr)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="llama-router-bench-") as name:
        yield Path(name)


def make_models(directory: Path, shapes: Mapping[str, TinyShape]) -> dict[str, Path]:
    """Write one tiny model per name as ``directory/NAME.gguf``."""
    directory.mkdir(parents=True, exist_ok=True)
    return {name: write_tiny_model(directory / f"{name}.gguf", shape) for name, shape in shapes.items()}


def shape_facts(shape: TinyShape) -> dict[str, Any]:
    return attrs.asdict(shape)


# ----------------------------------------------------------------------------------------------- requests


def prompt_text(words: int, seed: int) -> str:
    """``words`` random words from a seeded generator: the same seed gives the same text."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat_body(
    model: str,
    tokens: int,
    text: str = "Hello",
    *,
    stream: bool = False,
    cache_prompt: bool | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A chat request that generates exactly ``tokens`` tokens (end-of-sequence ignored, greedy)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages) if messages is not None else [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }
    if cache_prompt is not None:
        body["cache_prompt"] = cache_prompt
    return body


def async_client(url: str, timeout: float = 300.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits)


@attrs.frozen
class StreamResult:
    """One streamed request: status, seconds to the first content chunk and to the end, chunk count."""

    status: int
    ttft: float | None
    total: float
    chunks: int
    first_chunk_at: float | None
    last_chunk_at: float | None

    @property
    def chunk_rate(self) -> float | None:
        """Content chunks per second after the first one."""
        if self.first_chunk_at is None or self.last_chunk_at is None or self.chunks < 2:
            return None
        span = self.last_chunk_at - self.first_chunk_at
        return (self.chunks - 1) / span if span > 0 else None


def _has_content(event: Mapping[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            return True
    return False


async def stream_chat(client: httpx.AsyncClient, body: Mapping[str, Any], path: str) -> StreamResult:
    """Send a streaming chat request and time its content chunks (SSE ``data:`` lines with text)."""
    started = time.perf_counter()
    first: float | None = None
    last: float | None = None
    chunks = 0
    async with client.stream("POST", path, json=dict(body)) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                continue
            if _has_content(event):
                now = time.perf_counter()
                chunks += 1
                if first is None:
                    first = now
                last = now
        status = response.status_code
    total = time.perf_counter() - started
    return StreamResult(
        status=status,
        ttft=None if first is None else first - started,
        total=total,
        chunks=chunks,
        first_chunk_at=first,
        last_chunk_at=last,
    )


async def fetch_json(client: httpx.AsyncClient, path: str) -> Any:
    response = await client.get(path)
    response.raise_for_status()
    return response.json()


async def router_models(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The models (not pools) a router lists in /v1/models, in its order."""
    document = await fetch_json(client, "/v1/models")
    return [entry for entry in document.get("data", []) if "pool" not in entry]


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


def base_parser(description: str) -> argparse.ArgumentParser:
    """Options of every benchmark: ``--url`` of a running router, the binary, ``--keep``, ``--name``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--url", help="a running router (e.g. http://127.0.0.1:8080); default: start one on tiny models"
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
                work, local.models, router=local.router, devices=local.devices, binary=binary
            ) as service:
                result = trio.run(benchmark, service.url, args)
    document["result"] = result
    report(result)
    path = write_result(args.name or name, document)
    print(f"wrote {path}")
    return 0
