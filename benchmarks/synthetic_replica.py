"""A synthetic llama-server: the endpoints the router uses, answered at once, and streamed chat chunks paced
at a chosen rate, without a model's CPU cost. It lets a benchmark measure what relaying costs the router.

It takes llama-server's command line (``--host``, ``--port``, ``-m``, ``-c``, ``-np``, ``-a``, ``--metrics``;
every other flag is skipped), answers ``--help`` with llama-server b11434's help text, ``--version`` with
that build, and ``--list-devices`` with no device. Its replies have the shapes llama-server b11434 gives
(``benchmarks/llama_server_capture.json`` holds a capture of the real binary): ``/props`` and
``/v1/models`` are that capture with this process's model, slots and context filled in.

Generation endpoints (``POST /v1/chat/completions``, ``/chat/completions``, ``/v1/completions``,
``/completions``) stream one HTTP chunk per token, built when the request arrives (one socket write per
chunk, no JSON encoding per chunk). A request may set, beside the usual fields:

    synthetic_rate         content chunks per second (0 or less: as fast as the socket takes them)
    synthetic_chunk_bytes  size of each content event (``data: {...}\\n\\n``); the text is padded to it
    synthetic_ttft_ms      milliseconds before the first chunk (prompt processing)

and the environment gives the defaults of every process: ``SYNTHETIC_RATE`` (50), ``SYNTHETIC_CHUNK_BYTES``
(unset: word-sized pieces, so events are as long as llama-server's, about 250-300 bytes with a model path
of 30-60 characters), ``SYNTHETIC_TTFT_MS`` (0) and ``SYNTHETIC_TOKENS`` (16: the tokens of a request that
names no ``max_tokens``). The k-th content chunk of a stream goes out k/rate seconds after its first, on an
absolute schedule; a client that does not read pauses its stream, as a full socket pauses llama-server.
At most ``-np`` requests generate at once; later ones wait for a slot. Slot save and restore answer 501.

    python benchmarks/synthetic_replica.py --port 8081 -m model.gguf -np 64
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.synthetic_stream import (  # noqa: E402
    BUILD_INFO,
    KEEP_ALIVE_MAX,
    KEEP_ALIVE_S,
    Stream,
    head,
    render,
)

HERE = Path(__file__).resolve().parent
HELP_TEXT = ROOT / "tests" / "support" / "llama-server-help.txt"
CAPTURE = HERE / "llama_server_capture.json"
VERSION_TEXT = "version: 0.6.0-dev (build 11434, commit synthetic)\nbuilt with python for benchmarks\n"
GENERATE = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"})


def _env_float(name: str, default: float | None) -> float | None:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


# ------------------------------------------------------------------------------------------ command line

_VALUE_FLAGS = {
    "--host": "host",
    "--port": "port",
    "-m": "model",
    "--model": "model",
    "-c": "ctx",
    "--ctx-size": "ctx",
    "-np": "parallel",
    "--parallel": "parallel",
    "-a": "alias",
    "--alias": "alias",
}


def parse_args(args: list[str]) -> dict[str, Any]:
    """The llama-server flags this server reads; any other ``--flag [value]`` is skipped."""
    found: dict[str, Any] = {"host": "127.0.0.1", "port": 8080, "model": "", "ctx": 4096, "parallel": 1}
    found.update(alias=None, metrics=False)
    i = 0
    while i < len(args):
        name, eq, inline = args[i].partition("=")
        i += 1
        if name in _VALUE_FLAGS:
            value = inline if eq else args[i] if i < len(args) else ""
            i += 0 if eq else 1
            key = _VALUE_FLAGS[name]
            found[key] = int(value) if key in ("port", "ctx", "parallel") else value
        elif name == "--metrics":
            found["metrics"] = True
        elif name.startswith("-") and not eq and i < len(args) and not args[i].startswith("--"):
            i += 1  # an unknown flag's value (negative numbers included)
    return found


# -------------------------------------------------------------------------------------------- the server


class Replica:
    """What the connections share: options, slots in use, requests waiting for one, fixed documents."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.slots = max(int(options["parallel"]), 1)
        self.n_ctx_slot = int(options["ctx"]) // self.slots
        self.model_id: str = options["alias"] or options["model"]
        self.model_json = json.dumps(self.model_id)
        self.active = 0
        self.waiting: collections.deque[Stream] = collections.deque()
        self.loop = asyncio.get_running_loop()
        self.counter = 0
        self.rate = _env_float("SYNTHETIC_RATE", 50.0) or 0.0
        self.chunk_bytes = _env_float("SYNTHETIC_CHUNK_BYTES", None)
        self.ttft_ms = _env_float("SYNTHETIC_TTFT_MS", 0.0) or 0.0
        self.tokens = int(_env_float("SYNTHETIC_TOKENS", 16.0) or 16)
        capture = json.loads(CAPTURE.read_text())
        self.props = capture["props"]["body"]
        self.models = capture["models"]["body"]
        self._fill_documents()

    def _fill_documents(self) -> None:
        path, name = self.options["model"], self.model_id
        self.props.update(total_slots=self.slots, model_alias=name, model_path=path, build_info=BUILD_INFO)
        self.props["default_generation_settings"]["n_ctx"] = self.n_ctx_slot
        self.props["endpoint_metrics"] = bool(self.options["metrics"])
        self.models["models"][0].update(name=name, model=name)
        entry = self.models["data"][0]
        entry.update(id=name, aliases=[name], created=int(time.time()))
        entry["meta"]["n_ctx"] = self.n_ctx_slot

    def next_id(self) -> str:
        self.counter += 1
        return f"chatcmpl-syn{os.getpid():09d}{self.counter:020d}"

    def admit(self, stream: Stream) -> None:
        if self.active < self.slots:
            self.active += 1
            stream.begin()
        else:
            self.waiting.append(stream)

    def release(self) -> None:
        self.active -= 1
        while self.waiting and self.active < self.slots:
            stream = self.waiting.popleft()
            if not stream.conn.closed:
                self.active += 1
                stream.begin()


def _error(code: int, message: str, kind: str) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"message": message, "type": kind, "code": code}}


STATUS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 501: "501 Not Implemented"}


class Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests one at a time, kept alive as cpp-httplib keeps them."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False
        self.paused = False
        self.stream: Stream | None = None
        self.requests = 0
        self.idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle is not None:
            self.idle.cancel()
        if self.stream is not None:
            self.stream.abandon()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.stream is not None and self.stream.stalled:
            self.stream.stalled = False
            self.stream.step()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _arm_idle(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        self.idle = self.replica.loop.call_later(KEEP_ALIVE_S, self._idle_out)

    def _idle_out(self) -> None:
        if not self.busy and self.transport is not None:
            self.transport.close()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked_body(start)
            if body is None:
                return
        else:
            length = int(headers.get("content-length") or 0)
            if len(self.buffer) < start + length:
                return
            body = bytes(self.buffer[start : start + length])
            del self.buffer[: start + length]
        parts = head[0].split(" ")
        method, path = parts[0], parts[1].split("?", 1)[0] if len(parts) > 1 else "/"
        self.requests += 1
        close = headers.get("connection", "").lower() == "close" or self.requests >= KEEP_ALIVE_MAX
        if self.idle is not None:
            self.idle.cancel()
        self.busy = True
        self._dispatch(method, path, body, close)

    def _chunked_body(self, start: int) -> bytes | None:
        data, at = bytearray(), start
        while True:
            line_end = self.buffer.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(bytes(self.buffer[at:line_end]).split(b";")[0] or b"0", 16)
            if size == 0:
                tail = self.buffer.find(b"\r\n\r\n", line_end)
                if tail < 0:
                    return None
                del self.buffer[: tail + 4]
                return bytes(data)
            if len(self.buffer) < line_end + 2 + size + 2:
                return None
            data += self.buffer[line_end + 2 : line_end + 2 + size]
            at = line_end + 2 + size + 2

    def _dispatch(self, method: str, path: str, raw: bytes, close: bool) -> None:
        replica = self.replica
        if method == "POST" and path in GENERATE:
            try:
                body = json.loads(raw or b"{}")
            except ValueError as exc:
                self.send_json(*_error(400, f"Invalid JSON: {exc}", "invalid_request_error"), close)
                return
            if not isinstance(body, dict):
                self.send_json(*_error(400, "the body must be an object", "invalid_request_error"), close)
                return
            self.stream = Stream(self, body, chat="chat" in path, close=close)
            replica.admit(self.stream)
            return
        self.send_json(*_answer(replica, method, path, raw), close)

    def send_json(self, code: int, document: Any, close: bool) -> None:
        """A JSON reply (a string: plain text)."""
        if isinstance(document, str):
            payload, kind = document.encode(), "text/plain; version=0.0.4"
        else:
            payload, kind = (
                json.dumps(document, separators=(",", ":")).encode(),
                "application/json; charset=utf-8",
            )
        self.write(head(STATUS.get(code, f"{code} Error"), kind, len(payload), close) + payload)
        self.finished(close)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def finished(self, close: bool) -> None:
        self.busy = False
        self.stream = None
        if close:
            if self.transport is not None:
                self.transport.close()
            return
        self._arm_idle()
        if self.buffer:
            self._next_request()


def _answer(replica: Replica, method: str, path: str, raw: bytes) -> tuple[int, Any]:
    """The endpoints that generate nothing."""
    if path in ("/health", "/v1/health"):
        return 200, {"status": "ok"}
    if path == "/slots" and method == "GET":
        return 200, [
            {"id": i, "n_ctx": replica.n_ctx_slot, "speculative": False, "is_processing": i < replica.active}
            for i in range(replica.slots)
        ]
    if path.startswith("/slots/"):
        return _error(
            501,
            "This server does not support slots action. Start it with `--slot-save-path`",
            "not_supported_error",
        )
    if path == "/props":
        return 200, replica.props
    if path in ("/v1/models", "/models"):
        return 200, replica.models
    if path == "/metrics":
        if not replica.options["metrics"]:
            return _error(
                501,
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            )
        return 200, (  # Prometheus text, as llama-server's
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {replica.active}\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            f"llamacpp:requests_deferred {len(replica.waiting)}\n"
        )
    if method == "POST" and path in ("/tokenize", "/detokenize", "/apply-template"):
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            return _error(400, f"Invalid JSON: {exc}", "invalid_request_error")
        if path == "/tokenize":
            return 200, {"tokens": [hash(w) % 32000 for w in str(body.get("content", "")).split()]}
        if path == "/detokenize":
            return 200, {"content": " ".join(f"t{t}" for t in body.get("tokens") or [])}
        return 200, {"prompt": render(body.get("messages") or []) + "<|im_start|>assistant\n"}
    return _error(404, "File Not Found", "not_found_error")


# ------------------------------------------------------------------------------------------------- start


async def serve(options: dict[str, Any]) -> None:
    replica = Replica(options)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(replica), options["host"], options["port"], backlog=2048, reuse_address=True
    )
    port = server.sockets[0].getsockname()[1]
    host = options["host"]
    print(f"main: HTTP server is listening, hostname: {host}, port: {port}, http threads: 1", file=sys.stderr)
    print(f"srv          init: initializing slots, n_slots = {replica.slots}", file=sys.stderr)
    print(
        f"main: server is listening on http://{host}:{port} - starting the main loop",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str]) -> int:
    flags = set(argv[1:])
    if flags & {"-h", "--help", "--usage"}:
        sys.stdout.buffer.write(HELP_TEXT.read_bytes())
        return 0
    if "--version" in flags:
        sys.stderr.write(VERSION_TEXT)
        return 0
    if "--list-devices" in flags:
        sys.stdout.write("Available devices:\n")
        return 0
    asyncio.run(serve(parse_args(argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
