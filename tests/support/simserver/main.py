"""Start-up, model "loading" and shutdown: ``--help``, ``--version``, binding the port, the load log lines
(or a simulated load failure), the start record a test reads, and SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import sys
import threading
import time
from typing import Any

from tests.support.simserver.args import Options, parse_args
from tests.support.simserver.behaviour import Behaviour, load_behaviour
from tests.support.simserver.handler import Handler
from tests.support.simserver.http_base import SimHTTPServer
from tests.support.simserver.log import log
from tests.support.simserver.shapes import BUILD_INFO
from tests.support.simserver.slots import ServerState

HELP_TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "llama-server-help.txt")
HELP_FLAGS = frozenset({"-h", "--help", "--usage"})
# What llama-server b11434 prints for --version (on stderr), for the simulator: it takes b11434's flags.
SIM_BUILD = 11434
VERSION_TEXT = f"version: sim (build {SIM_BUILD}, commit {BUILD_INFO})\nbuilt with python for simulation\n"


def _device_name(options: Options) -> str:
    if options.n_gpu_layers == 0:
        return "CPU"
    for var, prefix in (("HIP_VISIBLE_DEVICES", "ROCm"), ("CUDA_VISIBLE_DEVICES", "CUDA")):
        if os.environ.get(var, "").strip() not in ("", "-1"):
            return prefix + "0"
    return "CPU"


def _fail_load(path: str, reason: str, code: int = 1) -> None:
    log(f"llama_model_load: error loading model: {reason}")
    log("llama_model_load_from_file_impl: failed to load model")
    log(f"common_init_from_params: failed to load model '{path}'")
    log(f"srv    load_model: failed to load model, '{path}'")
    log("srv    operator(): operator(): cleaning up before exit...")
    log("main: exiting due to model loading error")
    os._exit(code)


_MAPPED: list[mmap.mmap] = []  # the weights stay mapped while the server runs, as llama-server's do
READ_STEPS = 20
PAGE = 4096


def _read_weights(path: str, seconds: float) -> None:
    """Take ``seconds`` to load: a model file of a MiB or more is mapped and its pages touched in
    ``READ_STEPS`` even steps over that time (the mapping's resident size grows as llama-server's does while
    it copies weights to a GPU); a smaller one (a JSON behaviour file) is just waited on."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if size < 1024 * 1024:
        time.sleep(seconds)
        return
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    _MAPPED.append(mapped)
    total = 0
    for step in range(READ_STEPS):
        for offset in range(size * step // READ_STEPS, size * (step + 1) // READ_STEPS, PAGE):
            total += mapped[offset]
        time.sleep(seconds / READ_STEPS)


def _load(state: ServerState, problem: str | None) -> None:
    options, behaviour = state.options, state.behaviour
    path = options.model
    log(f"srv    load_model: loading model '{path}'")
    if problem is not None:
        log(f"gguf_init_from_file: failed to open GGUF file '{path}' ({problem})")
        _fail_load(path, f"llama_model_loader: failed to load model from {path}")
    _read_weights(path, max(behaviour.load_delay, 0.0))
    device = _device_name(options)
    if behaviour.oom_at_load:
        mib = behaviour.oom_mib
        log(
            f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {mib:.2f} MiB on device 0: "
            "cudaMalloc failed: out of memory"
        )
        log(f"alloc_tensor_range: failed to allocate {device} buffer of size {int(mib * 1024 * 1024)}")
        _fail_load(path, f"unable to allocate {device} buffer")
    if behaviour.exit_at_load is not None:
        log("llama_model_load: error loading model: simulated load failure")
        _fail_load(path, "simulated load failure", behaviour.exit_at_load)
    _report_gpu_memory(behaviour)
    kv_mib = state.n_ctx / 1024 * 16.0
    log(f"load_tensors: {device:>12} model buffer size = {behaviour.model_mib:9.2f} MiB")
    log(f"llama_context: n_ctx = {state.n_ctx}, n_seq_max = {len(state.pool.slots)}")
    log(f"llama_kv_cache: {device:>12} KV buffer size = {kv_mib:9.2f} MiB")
    log(f"llama_context: {device:>12} compute buffer size = {32.0:9.2f} MiB")
    log(f"srv          init: initializing slots, n_slots = {len(state.pool.slots)}")
    if behaviour.record_dir:
        _mark_loaded(behaviour.record_dir)
    state.ready.set()
    log("main: model loaded")
    log(f"main: server is listening on http://{options.host}:{state.port} - starting the main loop")
    log("srv  update_slots: all slots are idle")


def _report_gpu_memory(behaviour: Behaviour) -> None:
    """Tell a stand-in NVML that this process holds ``gpu_mib`` on every GPU it was shown."""
    procs = os.environ.get("FAKE_NVML_PROCS_DIR")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if behaviour.gpu_mib is None or not procs or not visible.strip():
        return
    lines = "".join(f"{gpu.strip()} {behaviour.gpu_mib:.0f}\n" for gpu in visible.split(","))
    tmp = os.path.join(procs, f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(lines)
    os.replace(tmp, os.path.join(procs, str(os.getpid())))


def _write_record(record_dir: str, state: ServerState, argv: list[str]) -> None:
    os.makedirs(record_dir, exist_ok=True)
    pid = os.getpid()
    record = {
        "argv": argv,
        "env": {"CUDA_VISIBLE_DEVICES": None, "HIP_VISIBLE_DEVICES": None, **os.environ},
        "pid": pid,
        "port": state.port,
        "model": state.options.model,
        "started": time.time(),
    }
    tmp = os.path.join(record_dir, f".{pid}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(record_dir, f"{pid}.json"))


def _mark_loaded(record_dir: str) -> None:
    """Add ``"loaded": true`` to this process's start record, before /health answers 200: a test can
    tell what was reported before the load ended."""
    path = os.path.join(record_dir, f"{os.getpid()}.json")
    with open(path) as f:
        record = json.load(f)
    tmp = os.path.join(record_dir, f".{os.getpid()}.json.tmp")
    with open(tmp, "w") as f:
        json.dump({**record, "loaded": True}, f)
    os.replace(tmp, path)


SIGTERM_IGNORED = "srv    operator(): SIGTERM received and ignored (simulated)"


def _on_sigterm(signum: int, frame: Any) -> None:
    log("srv    operator(): operator(): cleaning up before exit...")
    os._exit(0)


def _ignore_sigterm(signum: int, frame: Any) -> None:
    # Said, so that a test can tell the signal came and was ignored without waiting to see nothing happen;
    # one write, not log(): the main thread may hold log()'s lock when the signal comes.
    os.write(2, SIGTERM_IGNORED.encode() + b"\n")


# What --list-devices prints: one simulated GPU, unless this variable lists others, separated by ";" ("" or
# "none": none, as a CPU-only build on a host without GPUs prints).
DEVICES_ENV = "SIM_LIST_DEVICES"
SIM_DEVICE = "SIM0: Simulated GPU (24576 MiB, 24576 MiB free)"


def devices_text(listed: str | None) -> str:
    names = [SIM_DEVICE] if listed is None else [d for d in listed.split(";") if d and d != "none"]
    return "Available devices:\n" + "".join(f"  {name}\n" for name in names or ["(none)"])


def main(argv: list[str]) -> int:
    if HELP_FLAGS & set(argv[1:]):
        with open(HELP_TEXT, "rb") as f:
            sys.stdout.buffer.write(f.read())
        sys.stdout.flush()
        return 0
    if "--version" in argv[1:]:
        sys.stderr.write(VERSION_TEXT)
        return 0
    if "--list-devices" in argv[1:]:
        sys.stdout.write(devices_text(os.environ.get(DEVICES_ENV)))
        return 0
    options = parse_args(argv[1:])
    problem: str | None = None
    behaviour: Behaviour | None = None
    try:
        behaviour = load_behaviour(options.model)
    except FileNotFoundError:
        problem = "No such file or directory"
    except (OSError, ValueError, TypeError) as exc:
        log(f"error: bad simulated model file '{options.model}': {exc}")
        return 1
    if behaviour is not None and behaviour.ignore_sigterm:
        signal.signal(signal.SIGTERM, _ignore_sigterm)
    else:
        signal.signal(signal.SIGTERM, _on_sigterm)
    log(f"build: 0 ({BUILD_INFO}) with python {sys.version.split()[0]} for simulation")
    log("main: binding port with default address family")
    try:
        server = SimHTTPServer((options.host, options.port), Handler)
    except OSError as exc:
        log(f"main: couldn't bind HTTP server socket, hostname: {options.host}, port: {options.port} ({exc})")
        return 1
    port = server.server_address[1]
    state = ServerState(options, behaviour, port)
    server.state = state
    if state.behaviour.record_dir:
        _write_record(state.behaviour.record_dir, state, argv)
    log(f"main: HTTP server is listening, hostname: {options.host}, port: {port}, http threads: 16")
    log("main: loading model")
    threading.Thread(target=_load, args=(state, problem), daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.5)
    return 0
