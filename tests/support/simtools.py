"""Helpers for tests that use the simulated llama-server (tests/support/simserver)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from router.placement.synthetic import SyntheticModel, write_header_only
from router.shell.ports import free_port
from tests.support import REPO
from tests.support.simserver import BEHAVIOUR_KEYS, SIDECAR_SUFFIX
from tests.support.waiting import until_blocking

LAUNCHER_NAME = "sim-llama-server"


def _check_keys(behaviour: Mapping[str, Any]) -> None:
    unknown = sorted(set(behaviour) - BEHAVIOUR_KEYS)
    if unknown:
        raise TypeError(f"unknown simulated-model behaviour keys: {', '.join(unknown)}")


def write_sim_model(dir: Path, name: str, **behaviour: Any) -> Path:
    """Write the simulated model file ``dir/<name>.json`` (its ``name`` defaults to ``name``) and return it.

    Keys are those of ``tests.support.simserver.Behaviour``: load_delay, tokens, token_rate, prompt_rate,
    crash_after_tokens, oom_at_load, oom_mib, exit_at_load, hang_health, ignore_sigterm, record_dir,
    embedding_dim, reply, n_ctx_train, model_mib, web_ui."""
    _check_keys(behaviour)
    data = {"name": name, **{k: str(v) if isinstance(v, Path) else v for k, v in behaviour.items()}}
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def write_padded_model(dir: Path, name: str, mib: int, **behaviour: Any) -> Path:
    """``write_sim_model``, padded with spaces to ``mib`` MiB: the simulator then maps the file and touches
    its pages over its ``load_delay``, as llama-server reads its weights (a load whose progress shows)."""
    path = write_sim_model(dir, name, **behaviour)
    text = path.read_text()
    path.write_text(text + " " * (mib * (1 << 20) - len(text)))
    return path


def write_sim_sidecar(model_file: Path, **behaviour: Any) -> Path:
    """Give a real GGUF file simulated behaviour: writes ``<model_file>.sim.json`` next to it."""
    _check_keys(behaviour)
    data = {k: str(v) if isinstance(v, Path) else v for k, v in behaviour.items()}
    path = model_file.with_name(model_file.name + SIDECAR_SUFFIX)
    path.write_text(json.dumps(data, indent=1))
    return path


def write_sim_gguf(dir: Path, stem: str, shape: SyntheticModel, **behaviour: Any) -> Path:
    """A header-only GGUF of ``shape`` at ``dir/<stem>.gguf`` (placement reads it) whose simulated replica
    behaves as ``behaviour`` says."""
    dir.mkdir(parents=True, exist_ok=True)
    (path,) = write_header_only(dir / f"{stem}.gguf", shape)
    write_sim_sidecar(path, **behaviour)
    return path


def placed_sim_model(dir: Path, name: str, shape: SyntheticModel, **behaviour: Any) -> str:
    """:func:`write_sim_gguf` with quick loads, recording its starts under ``dir/../records/<name>`` (where
    ``RouterHandle.records_of`` looks when ``dir`` is a folder of the test's directory)."""
    record_dir = str(dir.parent / "records" / name)
    return str(write_sim_gguf(dir, name, shape, load_delay=0.05, record_dir=record_dir, **behaviour))


def sim_launcher(dir: Path) -> Path:
    """Write an executable ``dir/sim-llama-server`` that runs the simulator with its arguments, in the same
    process (so its pid is the simulator's), and return its path. Use it as the llama-server binary."""
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / LAUNCHER_NAME
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support.simserver import main\n"
        "raise SystemExit(main(sys.argv))\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def read_records(record_dir: Path | str) -> list[dict[str, Any]]:
    """The start records the simulator wrote into ``record_dir`` (one per process), oldest first."""
    root = Path(record_dir)
    if not root.is_dir():
        return []
    records = [json.loads(p.read_text()) for p in root.glob("*.json")]
    return sorted(records, key=lambda r: (r.get("started", 0.0), r.get("pid", 0)))


def sim_command(
    model: Path,
    port: int,
    ctx: int = 4096,
    slots: int = 1,
    extra: Sequence[str] = ("--fit", "off", "-ngl", "99"),
) -> list[str]:
    """The command line the router would use, with the simulator in place of llama-server."""
    return [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.support.simserver import main; "
        "raise SystemExit(main(sys.argv))",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-m",
        str(model),
        "-c",
        str(ctx),
        "-np",
        str(slots),
        *extra,
    ]


def wait_listening(port: int, timeout: float = 5.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until something accepts connections on ``port`` (fails when ``proc`` exits first)."""

    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"simulated server exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        return False

    until_blocking(listening, timeout=timeout, what=f"something listening on port {port}")


@attrs.define(eq=False)
class SimRun:
    """A running simulator: its process, base URL and log file."""

    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_sim(
    model: Path,
    ctx: int = 4096,
    slots: int = 1,
    extra: Sequence[str] = ("--fit", "off", "-ngl", "99"),
    env: Mapping[str, str] | None = None,
    wait: bool = True,
) -> Iterator[SimRun]:
    """Run the simulator on a free port, its stderr going to ``<model>.<port>.log``; yields once it listens
    (at once when not ``wait``: for a process expected to fail) and kills it afterwards."""
    port = free_port()
    log_path = model.with_name(f"{model.name}.{port}.log")
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            sim_command(model, port, ctx, slots, extra),
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    try:
        if wait:
            wait_listening(port, proc=proc)
        yield SimRun(proc, f"http://127.0.0.1:{port}", port, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
