"""Processes of the benchmarks that run the real llama-server: the router, a bare llama-server and
llama.cpp's own router mode, the work directory and the tiny models they serve.

The benchmarks run as scripts (``python benchmarks/bench_X.py``); each puts the repository root on
``sys.path`` and imports the shared modules as ``benchmarks.services``, ``benchmarks.workload`` and
``benchmarks.results``. Everything listens on 127.0.0.1 only.

Processes started here are context managers that wait for ``/health`` and stop their process (SIGTERM, then
SIGKILL) when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from router.cli.tinymodel import TinyShape, write_tiny_model  # noqa: E402
from router.hosts.locate import find_llama_server  # noqa: E402
from router.shell.ports import free_port  # noqa: E402

READY_TIMEOUT = 90.0
# Memory declared for each GPU of a self-started router: room for the tiny models beside the router's
# default reserve of 512 MiB (residency caps, not memory, make the swaps).
DEVICE_MIB = 2048
ROUTER_ENV = frozenset(
    ("ROUTER_HOST", "ROUTER_PORT", "ROUTER_API_KEYS", "HISTORY_DB_PATH", "ROUTER_CONFIG_PATH")
)


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
    keys: Mapping[str, Any] | None = None,
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
            "kv_store_dir": str(work_dir / "kv"),
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
    if keys:
        doc["keys"] = dict(keys)
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
