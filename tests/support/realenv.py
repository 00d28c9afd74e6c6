"""Helpers for tests that run the real llama-server binary on tiny generated models.

Without the binary (or its vocab files) such tests are skipped, with the command that installs them;
with ``LLAMA_ROUTER_REQUIRE_REAL=1`` in the environment they fail instead, so CI cannot pass by skipping.
``LLAMA_ROUTER_LLAMA_SERVER`` names a binary to use instead of the normal lookup (e.g. a GPU build).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import attrs
import pytest

from router.cli.tinymodel import TinyShape, vocab_file, write_tiny_model
from router.hosts.locate import INSTALL_COMMAND, LlamaServerNotFound, find_llama_server, vocab_dir
from router.shell.ports import free_port
from tests.support.processes import Launched, NotReady, launched

REQUIRE_REAL_ENV = "LLAMA_ROUTER_REQUIRE_REAL"
BINARY_ENV = "LLAMA_ROUTER_LLAMA_SERVER"

_models: dict[TinyShape, Path] = {}
_models_lock = threading.Lock()
_model_dir: Path | None = None


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get(REQUIRE_REAL_ENV) == "1":
        pytest.fail(f"{reason}\n({REQUIRE_REAL_ENV}=1 makes this a failure instead of a skip)", pytrace=False)
    pytest.skip(reason)


def require_llama_server() -> Path:
    """The llama-server binary to test against; skips (or fails, see module doc) when there is none."""
    try:
        return find_llama_server(os.environ.get(BINARY_ENV) or None)
    except LlamaServerNotFound as exc:
        _unavailable(f"real llama-server tests need the binary; install it with {INSTALL_COMMAND}\n{exc}")


def require_vocab_dir(name: str = "llama-spm") -> Path:
    """The directory of ``ggml-vocab-*.gguf`` files, provided it holds ``ggml-vocab-<name>.gguf``."""
    directory = vocab_dir()
    try:
        vocab_file(directory, name)
    except FileNotFoundError:
        _unavailable(f"tiny models need tokenizer files in {directory}; install them with {INSTALL_COMMAND}")
    return directory


def _shared_model_dir() -> Path:
    global _model_dir
    if _model_dir is None:
        _model_dir = Path(tempfile.mkdtemp(prefix="llama-router-tiny-models-"))
        atexit.register(shutil.rmtree, _model_dir, True)
    return _model_dir


def _file_name(shape: TinyShape) -> str:
    fields = "-".join(f"{k}={v}" for k, v in attrs.asdict(shape).items())
    return f"tiny-{fields}.gguf"


def tiny_model(shape: TinyShape | None = None) -> Path:
    """A tiny model file of ``shape`` (default :class:`TinyShape`), written once per test process."""
    shape = TinyShape() if shape is None else shape
    with _models_lock:
        path = _models.get(shape)
        if path is None or not path.is_file():
            path = write_tiny_model(
                _shared_model_dir() / _file_name(shape), shape, require_vocab_dir(shape.vocab)
            )
            _models[shape] = path
        return path


@contextlib.contextmanager
def running_llama_server(
    model: Path, *extra: str, ctx: int = 1024, slots: int = 2, threads: int = 1, ready_timeout: float = 60.0
) -> Iterator[Launched]:
    """Run the real llama-server on ``model`` (CPU only, no fitting) until the block ends.

    Waits for ``/health`` to answer 200; fails the test with the server's log if it exits or times out.
    """
    binary = require_llama_server()
    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="llama-server-log-"))
    argv = [
        str(binary),
        *("--host", "127.0.0.1", "--port", str(port), "-m", str(model)),
        *("-c", str(ctx), "-np", str(slots), "--fit", "off", "-ngl", "0", "-t", str(threads)),
        *extra,
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        with contextlib.ExitStack() as stack:
            try:
                server = stack.enter_context(
                    launched(
                        argv, url, log_dir / "server.log", name="llama-server", ready_timeout=ready_timeout
                    )
                )
            except NotReady as exc:
                pytest.fail(str(exc), pytrace=False)
            yield server
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
