"""The HTTP server and the plumbing of its request handler: reading bodies, sending JSON and chunks,
llama-server's CORS headers, and noticing a client that went away.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.simserver.generation import RequestError
from tests.support.simserver.log import log
from tests.support.simserver.slots import ServerState


def peer_gone(sock: socket.socket, wait: float = 0.0) -> bool:
    """Wait up to ``wait`` seconds; True as soon as the peer has closed (or reset) the connection."""
    deadline = time.monotonic() + wait
    while True:
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            readable, _, _ = select.select([sock], [], [], remaining)
            if not readable:
                return False
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                return True
        except BlockingIOError:
            continue
        except (OSError, ValueError):
            return True
        # Bytes are waiting (a pipelined request): the connection is alive; sit out the rest.
        time.sleep(max(deadline - time.monotonic(), 0.0))
        return False


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    state: ServerState

    def handle_error(self, request: Any, client_address: Any) -> None:
        log(f"srv  log_server_r: connection error from {client_address}: {sys.exc_info()[1]!r}")


_QUIET_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/slots", "/props"})


class HandlerBase(BaseHTTPRequestHandler):
    """The plumbing every endpoint uses: bodies in, JSON and chunks out, CORS, a client that went away."""

    protocol_version = "HTTP/1.1"
    server_version = "llama.cpp"
    sys_version = ""
    disable_nagle_algorithm = True
    server: SimHTTPServer
    _streaming: bool = False

    # -- plumbing --------------------------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self.server.state

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = self.path.split("?", 1)[0]
        if path not in _QUIET_PATHS:
            log(f"srv  log_server_r: request: {self.command} {path} {self.client_address[0]} {code}")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> dict[str, Any]:
        raw = self._read_body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise RequestError(400, f"Invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        return body

    def _send(self, code: int, payload: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self._send_cors()
        self.end_headers()
        self.wfile.write(payload)

    def _send_cors(self) -> None:
        """Like llama-server: reflect the caller's Origin, whoever it is (the router must not pass it on)."""
        origin = self.headers.get("Origin")
        self.send_header("Access-Control-Allow-Origin", origin or "*")
        if origin:
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.send_header("Vary", "Origin")

    def send_json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json; charset=utf-8")

    def send_error_obj(self, err: RequestError) -> None:
        self.send_json(err.code, err.body())

    def _gone(self) -> bool:
        return peer_gone(self.connection)

    def _write_chunk(self, data: bytes) -> bool:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError:
            return False
        return True
