"""The synthetic llama-server of the benchmarks answers as llama-server b11434 does: the capture of the real
binary (benchmarks/llama_server_capture.json) and the synthetic replica's replies to the same requests have
the same events, in the same HTTP chunks, with the same keys in the same order and sizes within a few bytes;
its --help and --version are those the router reads."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.hosts.server_build import parse_version
from router.hosts.server_flags import parse_help
from router.shell.ports import free_port
from tests.support import REPO
from tests.support.simtools import wait_listening

LAUNCHER = REPO / "benchmarks" / "synthetic-llama-server"
CAPTURE = json.loads((REPO / "benchmarks" / "llama_server_capture.json").read_text())
# As long as the model path in the capture, so that the chunks' sizes compare.
ALIAS = "/tmp/cap/models/tiny-q8_0.gguf"


@contextlib.contextmanager
def synthetic(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    argv = [str(LAUNCHER), "--host", "127.0.0.1", "--port", str(port), "-m", str(tmp_path / "m.gguf")]
    argv += ["-c", "2048", "-np", "2", "-ngl", "0", "--fit", "off", "-t", "1", "--alias", ALIAS]
    env = {"PATH": "/usr/bin:/bin", "SYNTHETIC_PYTHON": sys.executable}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc=proc)
        yield port
    finally:
        proc.kill()
        proc.wait()


def request(port: int, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """One raw HTTP/1.1 exchange: status, header names, and the body whole or as its HTTP chunks."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"Content-Type: application/json\r\n\r\n" + payload)
        data = b""
        while True:
            data += sock.recv(65536)
            top, _, rest = data.partition(b"\r\n\r\n")
            if b"chunked" in top and rest.endswith(b"\r\n0\r\n\r\n"):
                break
            lines = top.decode().split("\r\n")
            length = [int(v.split(": ")[1]) for v in lines if v.lower().startswith("content-length")]
            if length and len(rest) >= length[0]:
                break
    lines = top.decode().split("\r\n")
    out: dict[str, Any] = {"status": int(lines[0].split()[1]), "names": [v.split(":")[0] for v in lines[1:]]}
    if b"chunked" not in top:
        out["body"] = json.loads(rest)
        return out
    chunks = []
    while True:
        size, _, rest = rest.partition(b"\r\n")
        if int(size, 16) == 0:
            break
        chunks.append(rest[: int(size, 16)].decode())
        rest = rest[int(size, 16) + 2 :]
    out["http_chunks"] = chunks
    return out


def events(chunk: str) -> list[str]:
    return [e.removeprefix("data: ") for e in chunk.split("\n\n") if e]


def shape(value: Any) -> Any:
    """Keys in order, all the way down; values reduced to their type (lists to their first element)."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return ["list", shape(value[0])] if value else ["list"]
    return (
        "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__
    )


def event_shape(event: str) -> Any:
    return event if event == "[DONE]" else shape(json.loads(event))


@pytest.mark.parametrize("name", ["chat_stream_usage", "chat_stream", "completion_stream"])
def test_streamed_chunks_have_the_capture_s_events_keys_and_sizes(tmp_path: Path, name: str) -> None:
    captured = CAPTURE[name]
    path = "/v1/completions" if name.startswith("completion") else "/v1/chat/completions"
    with synthetic(tmp_path) as port:
        got = request(port, "POST", path, {**captured["request"], "synthetic_rate": 500})
    assert got["status"] == captured["status"] == 200
    assert got["names"] == [n for n, _ in captured["headers"]]
    mine, theirs = got["http_chunks"], captured["http_chunks"]
    assert [len(events(c)) for c in mine] == [len(events(c)) for c in theirs]
    for ours, real in zip(mine, theirs, strict=True):
        assert [event_shape(e) for e in events(ours)] == [event_shape(e) for e in events(real)]
    content = slice(1, captured["request"]["max_tokens"])  # one event per HTTP chunk between the ends
    for ours, real in zip(mine[content], theirs[content], strict=True):
        assert abs(len(ours) - len(real)) <= 8, (ours, real)
        assert 200 <= len(ours) <= 320


@pytest.mark.parametrize("name", ["chat", "completion"])
def test_whole_replies_have_the_capture_s_keys(tmp_path: Path, name: str) -> None:
    captured = CAPTURE[name]
    path = "/v1/completions" if name == "completion" else "/v1/chat/completions"
    with synthetic(tmp_path) as port:
        got = request(port, "POST", path, {**captured["request"], "synthetic_rate": 500})
    assert shape(got["body"]) == shape(captured["body"])


def test_endpoints_without_generation_answer_with_the_capture_s_keys(tmp_path: Path) -> None:
    with synthetic(tmp_path) as port:
        assert request(port, "GET", "/health")["body"] == CAPTURE["health"]["body"]
        slots = request(port, "GET", "/slots")["body"]
        assert [shape(s) for s in slots] == [shape(s) for s in CAPTURE["slots_fresh"]["body"]]
        props = request(port, "GET", "/props")["body"]
        assert list(props) == list(CAPTURE["props"]["body"])
        assert (props["total_slots"], props["model_alias"]) == (2, ALIAS)
        models = request(port, "GET", "/v1/models")["body"]
        assert shape(models) == shape(CAPTURE["models"]["body"])
        assert models["data"][0]["id"] == ALIAS
        for key in ("tokenize", "apply_template"):
            path = "/" + key.replace("_", "-")
            got = request(port, "POST", path, CAPTURE[key]["request"])["body"]
            assert shape(got) == shape(CAPTURE[key]["body"])
        missing = request(port, "GET", "/nope")
        assert (missing["status"], shape(missing["body"])) == (404, shape(CAPTURE["not_found"]["body"]))


def test_help_and_version_are_those_the_router_reads() -> None:
    env = {"PATH": "/usr/bin:/bin", "SYNTHETIC_PYTHON": sys.executable}
    helped = subprocess.run([str(LAUNCHER), "--help"], capture_output=True, text=True, env=env, check=True)
    assert {"--port", "-np", "--slot-save-path", "--alias"} <= parse_help(helped.stdout)
    version = subprocess.run(
        [str(LAUNCHER), "--version"], capture_output=True, text=True, env=env, check=True
    )
    assert parse_version(version.stderr).number == 11434
