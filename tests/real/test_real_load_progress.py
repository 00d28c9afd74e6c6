"""A real llama-server's load, read from its process: through the mapping of its GGUF file (the default load
mode) and through the bytes it reads (``--load-mode none``, no mapping), until its /health answers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from router.shell.load_progress import WEIGHTS, LoadProgress, measure
from router.shell.ports import free_port
from router.shell.processes import ReplicaProcessInfo
from tests.support.realenv import require_llama_server, tiny_model
from tests.support.waiting import until_blocking

pytestmark = pytest.mark.real


@pytest.mark.parametrize(("mode", "source"), [("mmap", "mapped"), ("none", "read")])
def test_a_real_load_is_read_from_what_the_process_mapped_or_read(mode: str, source: str) -> None:
    model = tiny_model()
    port = free_port()
    argv = [
        str(require_llama_server()),
        *("--host", "127.0.0.1", "--port", str(port), "-m", str(model), "-c", "256", "-np", "1"),
        *("--fit", "off", "-ngl", "0", "-t", "1", "--load-mode", mode),
    ]
    started = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    info = ReplicaProcessInfo(1, "tiny", proc.pid, port, tuple(argv), started, False, False, None, None)
    readings: list[LoadProgress] = []

    def ready() -> bool:
        found = measure(info, [], Path("/proc"), time.time())
        if found is not None:
            readings.append(found)
        assert proc.poll() is None, f"llama-server exited with {proc.returncode}"
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200

    try:
        until_blocking(ready, timeout=60.0, what="llama-server ready", ignore=(httpx.TransportError,))
        last = measure(info, [], Path("/proc"), time.time())
    finally:
        proc.kill()
        proc.wait()
    assert readings and last is not None
    assert last.source == source
    assert last.fraction > 0.5 * WEIGHTS  # the weights are in: read whole, or mapped where warm-up used them
    assert last.fraction <= WEIGHTS  # the bytes alone never claim the rest of the load
    assert all(r.fraction <= WEIGHTS for r in readings)
