"""A model placed on a local rpc-server (CPU backend) through ``[rpc_devices]``, answering through the router,
against the real binaries. All traffic stays on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.shell.ports import free_port
from tests.support.harness import serving
from tests.support.realenv import _unavailable, require_llama_server
from tests.support.realharness import long_body, real_document
from tests.support.waiting import NotReached, until, until_blocking

pytestmark = pytest.mark.real

RPC_NAMES = ("ggml-rpc-server", "rpc-server")


def require_rpc_server() -> Path:
    """The rpc-server built next to llama-server (``scripts/install-llama-server`` builds both)."""
    folder = require_llama_server().resolve().parent
    for name in RPC_NAMES:
        if (folder / name).is_file():
            return folder / name
    _unavailable(
        f"RPC tests need {RPC_NAMES[0]} next to llama-server in {folder}; run scripts/install-llama-server"
    )


@contextlib.contextmanager
def rpc_server(log_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``ggml-rpc-server`` on 127.0.0.1 and a free port, until the block ends."""
    port = free_port()
    argv = [str(require_rpc_server()), "-H", "127.0.0.1", "-p", str(port), "-t", "1"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:

        def listening() -> bool:
            if process.poll() is not None:
                pytest.fail("rpc-server exited:\n" + log_path.read_text(errors="replace"))
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
            return False

        # Its output is block-buffered in a file: wait for the port instead.
        try:
            until_blocking(listening, timeout=30)
        except NotReached:
            pytest.fail("rpc-server does not listen:\n" + log_path.read_text(errors="replace"))
        yield port, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def connected(pid: int, port: int) -> bool:
    """Whether process ``pid`` has an established TCP connection to 127.0.0.1:``port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = fd.readlink().name
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    peer = f"0100007F:{port:04X}"
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2] == peer and fields[3] == "01" and fields[9] in inodes:
            return True
    return False


async def test_a_model_on_a_local_rpc_server_answers_through_the_router(tmp_path: Path) -> None:
    rpc_log = tmp_path / "rpc-server.log"
    with rpc_server(rpc_log) as (port, _):
        doc = real_document(tmp_path, {"remote": {"gpus": [], "rpc": ["box"]}}, router={"num_gpus": 0})
        doc["rpc_devices"] = {"box": {"endpoint": f"127.0.0.1:{port}", "memory_mib": 2048}}
        async with serving(tmp_path, doc, client_timeout=120.0) as rt:
            reply = await rt.client.post("/v1/chat/completions", json=long_body("remote", 8))
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"]

            status = await rt.status()
            (replica,) = status["replicas"]
            argv = Path(f"/proc/{replica['pid']}/cmdline").read_bytes().decode().split("\0")
            assert argv[argv.index("--rpc") + 1] == f"127.0.0.1:{port}"
            assert argv[argv.index("-ngl") + 1] != "0"
            (box,) = status["rpc_devices"]
            assert box["state"] == "in_use" and box["residents"] == ["remote"]
            assert 0 < box["predicted_bytes"] < box["budget_bytes"] == 2048 << 20

            # The replica holds a TCP connection to the rpc-server for as long as its model is loaded.
            assert connected(replica["pid"], port)
            await until(lambda: "Accepted client connection" in rpc_log.read_text(errors="replace"))
