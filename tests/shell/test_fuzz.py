"""Fuzzing the router's HTTP surface: whatever a client sends, it gets a well-formed answer in the OpenAI
error shape, never a 500 of the router's own, and the router keeps serving.

One router process (``python -m router``, simulated replicas) serves the whole module. Hypothesis sends it
request bodies (random JSON with lone surrogates, deep nesting, wrong types on the fields the router reads,
huge numbers, NaN, nulls, cut-off and raw bytes), headers (control characters, Latin-1 bytes, odd content
types and keys) and raw bytes on a socket. A 500 is accepted only when a replica sent it (the reply names
the model in ``x-router-model``); llama-server has its own 500s.

Protocol-level errors — a bad request line, raw bytes in the target, a duplicated Content-Length, a head
over 64 KiB arriving in pieces — are answered by hypercorn's h11 protocol itself, before any application
code runs; ``router.serve.hypercorn_fixes`` gives those answers the OpenAI shape too (``h11_refusal``).

The tier is sized to finish in well under a minute on two cores; ``LLAMA_ROUTER_FUZZ_SCALE=10`` runs ten
times as many examples.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.http.app import FORWARDED
from tests.support.harness import running_router
from tests.support.processes import Launched
from tests.support.routerproc import process_serving_sync
from tests.support.simconfig import config_document
from tests.support.tcp import queues
from tests.support.waiting import until

SCALE = float(os.environ.get("LLAMA_ROUTER_FUZZ_SCALE", "1"))
KEY = "fuzz-key"
AUTH = {"authorization": f"Bearer {KEY}"}
MODELS: dict[str, Any] = {
    "a": {"sim": {"tokens": 2, "token_rate": None, "load_delay": 0.05}},
    "b": {"gpus": [1], "sim": {"tokens": 2, "token_rate": None, "load_delay": 0.05}},
}
POOLS = {"p": {"members": ["a", "b"], "fallback": True}}
PATHS = (*FORWARDED, "/unload", "/upstream/a/v1/chat/completions", "/chat/a/v1/chat/completions")


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------------------------------- the router


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    dir = tmp_path_factory.mktemp("fuzz")
    router = {"num_gpus": 2, "api_keys": [KEY], "max_body_mib": 1, "queue_limit": 50}
    with process_serving_sync(dir, config_document(dir, MODELS, pools=POOLS, router=router)) as served:
        yield served


@pytest.fixture(scope="module")
def client(served: Launched) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30.0) as c:
        yield c


# -------------------------------------------------------------------------------------------- checking


def check_error_shape(body: bytes, where: str) -> dict[str, Any]:
    doc = json.loads(body)
    assert isinstance(doc, dict) and isinstance(doc.get("error"), dict), where
    error = doc["error"]
    assert isinstance(error.get("message"), str) and error["message"], where
    assert isinstance(error.get("type"), str) and error["type"], where
    assert "code" in error, where
    return dict(error)


def check_answer(response: httpx.Response, where: str) -> None:
    """A well-formed answer; an error is in the OpenAI shape; a 500 came from a replica."""
    status = response.status_code
    assert 100 <= status < 600, where
    where = f"{where} -> {status} {response.content[:300]!r}"
    if status >= 400:
        assert response.headers.get("content-type", "").startswith("application/json"), where
        error = check_error_shape(response.content, where)
        if status == 500:
            assert error["code"] != "internal_error", where
            assert "x-router-model" in response.headers, where  # a replica's own 500
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.content.split(b"\n"):
            data = line[5:].strip() if line.startswith(b"data:") else b""
            if data.startswith(b"{") and b'"error"' in data:
                check_error_shape(data, where)


def still_serving(client: httpx.Client, served: Launched) -> None:
    assert served.process.poll() is None, served.log_text()
    assert client.get("/health").status_code == 200
    normal = client.post(
        "/v1/chat/completions",
        json={"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=AUTH,
    )
    assert normal.status_code == 200, normal.text


# ------------------------------------------------------------------------------------------ strategies

# Text that may hold lone surrogates (json.dumps writes them as \udXXX escapes) and control characters.
texts = st.text(st.characters(exclude_categories=()), max_size=12)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**31, 2**63, 1e308]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]) | values, "content": texts | values}
    ),
    max_size=3,
)
FIELDS = {
    "model": st.sampled_from(["a", "b", "p", "nope", ""]) | values,
    "stream": st.booleans() | values,
    "max_tokens": st.integers(min_value=-2, max_value=8) | values,
    "max_completion_tokens": values,
    "n_predict": st.integers(min_value=-2, max_value=8) | values,
    "max_output_tokens": values,
    "messages": messages | values,
    "system": texts | values,
    "input": texts | st.lists(st.integers(0, 100), max_size=4) | values,
    "prompt": texts | values,
    "content": texts | values,
    "tools": values,
    "user": texts,
    "force": values,
}
documents = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries({}, optional=FIELDS),
    st.dictionaries(texts, values, max_size=2),
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A JSON document as bytes, sometimes bent: nested too deep, a huge number, cut off, or not JSON."""
    raw = json.dumps(draw(documents)).encode()  # NaN and Infinity come out as the bare words
    bend = draw(st.sampled_from(["none", "none", "none", "deep", "digits", "cut", "bytes", "scalar"]))
    if bend == "deep":
        depth = draw(st.integers(min_value=60, max_value=3000))
        return (
            raw[:-1] + (b', "deep": ' if raw != b"{}" else b'"deep": ') + b"[" * depth + b"]" * depth + b"}"
        )
    if bend == "digits":
        return (
            raw[:-1] + (b', "n": ' if raw != b"{}" else b'"n": ') + b"7" * draw(st.integers(300, 6000)) + b"}"
        )
    if bend == "cut":
        return raw[: draw(st.integers(min_value=0, max_value=len(raw)))]
    if bend == "bytes":
        return draw(st.binary(max_size=40))
    if bend == "scalar":
        return json.dumps(draw(values)).encode()
    return raw


# Header values h11 will send: no NUL, CR, LF or other whitespace controls, spaces only between words.
header_words = st.binary(min_size=1, max_size=8).map(
    lambda b: bytes(c for c in b if c not in b"\x00\t\n\x0b\x0c\r ") or b"x"
)
header_values = st.lists(header_words, max_size=3).map(b" ".join)
header_names = st.sampled_from(
    ["x-foo", "user-agent", "accept", "accept-encoding", "content-type", "x-api-key", "authorization",
     "openai-organization", "x-request-id", "cookie"]
)  # fmt: skip
headers = st.dictionaries(header_names, header_values, max_size=3)


# ----------------------------------------------------------------------------------------------- tests


@fuzz_settings(300)
@given(path=st.sampled_from(PATHS), raw=bodies())
def test_any_body_gets_a_well_formed_answer(client: httpx.Client, path: str, raw: bytes) -> None:
    response = client.post(path, content=raw, headers={**AUTH, "content-type": "application/json"})
    check_answer(response, f"POST {path} {raw[:200]!r}")


@fuzz_settings(120)
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/embeddings", "/health", "/unload"]), sent=headers)
def test_any_headers_get_a_well_formed_answer(
    client: httpx.Client, path: str, sent: dict[str, bytes]
) -> None:
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "input": "x", "max_tokens": 2}
    method = "GET" if path == "/health" else "POST"
    outgoing = [(b"authorization", AUTH["authorization"].encode())] if "authorization" not in sent else []
    outgoing += [(name.encode(), value) for name, value in sent.items()]
    response = client.request(method, path, content=json.dumps(body).encode(), headers=outgoing)
    check_answer(response, f"{method} {path} {sent!r}")


@fuzz_settings(150)
@given(data=st.binary(max_size=300))
def test_any_bytes_on_a_socket_get_a_well_formed_answer_or_a_close(served: Launched, data: bytes) -> None:
    """Random bytes as the rest of a request head (ended by a blank line, so that the server need not wait
    for more; the socket is not half-closed, which hypercorn takes for a client that left)."""
    host, port = served.url.removeprefix("http://").split(":")
    received = b""
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + data + b"\r\n\r\n")
        with contextlib.suppress(TimeoutError, ConnectionResetError):  # a Content-Length it waits for
            while not _complete(received) and (chunk := sock.recv(65536)):
                received += chunk
    for answer in split_responses(received):
        assert answer.status < 500 or answer.headers.get("x-router-model"), answer
        if answer.status >= 400:
            check_error_shape(answer.body, repr(data))


def test_the_router_is_still_serving_after_the_fuzzing(client: httpx.Client, served: Launched) -> None:
    still_serving(client, served)
    own = "\n".join(line for line in served.log_text().splitlines() if "router.replica:" not in line)
    assert not re.search(r"internal error [0-9a-f]{8} on|Traceback", own), own[-5000:]


# ------------------------------------------------------------------------------- protocol-level errors


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def split_responses(data: bytes) -> list[Answer]:
    """The HTTP/1.1 responses in ``data``; fails on anything that is not one."""
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"an incomplete response: {data[:300]!r}"
        lines = head.decode("latin-1").split("\r\n")
        version, code, *_ = lines[0].split(" ", 2)
        assert version == "HTTP/1.1" and code.isdigit(), lines[0]
        fields = dict(line.split(":", 1) for line in lines[1:])
        fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
        if code.startswith("1"):  # 100 Continue: no body, the answer follows
            body, data = b"", rest
        elif "content-length" in fields:
            size = int(fields["content-length"])
            body, data = rest[:size], rest[size:]
            assert len(body) == size, f"a cut-off body: {data[:300]!r}"
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                body, rest = body + rest[:size], rest[size + 2 :]
                if size == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        answers.append(Answer(int(code), fields, body))
    return answers


def h11_refusal(answer: Answer) -> bool:
    """hypercorn's own answer to a request h11 cannot parse: a 400 or 431 in the OpenAI shape (code
    ``invalid_http`` or ``headers_too_large``) that closes the connection."""
    try:
        code = json.loads(answer.body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        answer.status in (400, 431)
        and code in ("invalid_http", "headers_too_large")
        and answer.headers.get("connection") == "close"
    )


def request(head_lines: list[bytes], body: bytes = b"", target: bytes = b"/v1/chat/completions") -> bytes:
    return b"\r\n".join([b"POST " + target + b" HTTP/1.1", b"Host: x", *head_lines, b"", body])


BODY = b'{"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
CL = b"Content-Length: %d" % len(BODY)
PROTOCOL_CASES: dict[str, tuple[list[bytes], str]] = {
    # name: (what is sent, in pieces; who answers: "h11" or "router")
    "bad request line": ([b"GARBAGE\r\n\r\n"], "h11"),
    "raw bytes in the query": ([request([CL], BODY, target=b"/v1/chat/completions?q=\xff")], "h11"),
    "duplicate content-length": ([request([CL, b"Content-Length: 3"], BODY)], "h11"),
    "NUL in a header": ([request([CL, b"X-Foo: a\x00b"], BODY)], "h11"),
    "vertical tab in a header": ([request([CL, b"X-Foo: a\x0bb"], BODY)], "h11"),
    "bad chunk size": ([request([b"Transfer-Encoding: chunked"], b"zz\r\n")], "h11"),
    # h11 measures a head only while it is incomplete: 70 000 bytes without the blank line that ends it.
    "head over 64 KiB in pieces": ([request([CL, b"X-Big: " + b"a" * 70_000])[:-4], b"\r\n\r\n"], "h11"),
    # Sent at once, the head is usually read whole and measured by the router; if the reads happen to split
    # it past 64 KiB, h11 answers instead.
    "head over 64 KiB at once": ([request([CL, b"X-Big: " + b"a" * 65_600], BODY)], "either"),
    "control character in a header": ([request([CL, b"X-Foo: a\x01b"], BODY)], "router"),
    "DEL in the api key": ([request([CL, b"x-api-key: k\x7f"], BODY)], "router"),
    "unknown path": ([request([CL], BODY, target=b"/nope")], "router"),
    "percent-encoded junk in a model path": ([request([CL], BODY, target=b"/upstream/%ff%00/x")], "router"),
    "body shorter than content-length": ([request([b"Content-Length: 500"], BODY)], "router"),
}


def read_all(server_port: int, client_port: int) -> bool:
    """Whether the router has read all the client sent (or closed the connection)."""
    held = queues(server_port, client_port)
    return held is None or held.unread == 0


@pytest.mark.parametrize("case", list(PROTOCOL_CASES))
async def test_protocol_level_errors_are_well_formed_and_the_router_lives_on(
    tmp_path: Path, case: str
) -> None:
    pieces, who = PROTOCOL_CASES[case]
    async with running_router(tmp_path, {"a": MODELS["a"]}) as h:
        stream = await trio.open_tcp_stream(h.config.router.host, h.config.router.port)
        async with stream:
            ours = stream.socket.getsockname()[1]
            for piece in pieces:
                try:
                    await stream.send_all(piece)
                except trio.BrokenResourceError:  # refused and closed before the rest arrived
                    break
                # The router reads this piece before the next is sent: each comes in a read of its own.
                await until(lambda: read_all(h.config.router.port, ours), what="the piece read")
            if case == "body shorter than content-length":
                await stream.send_eof()
            received = b""
            with trio.move_on_after(10):
                while chunk := await stream.receive_some(65536):
                    received += chunk
                    if who != "h11" and _complete(received):
                        break
        if case == "body shorter than content-length":
            assert received == b"" or all(a.status < 500 for a in split_responses(received))
        else:
            (answer,) = split_responses(received)
            if who == "h11" or (who == "either" and h11_refusal(answer)):
                assert h11_refusal(answer), answer
                check_error_shape(answer.body, case)
            else:
                assert not h11_refusal(answer) and 400 <= answer.status < 500, answer
                check_error_shape(answer.body, case)
        assert (await h.client.get("/health")).status_code == 200
        normal = await h.client.post("/v1/chat/completions", content=BODY)
        assert normal.status_code == 200, normal.text


def _complete(data: bytes) -> bool:
    try:
        return bool(split_responses(data))
    except (AssertionError, ValueError):
        return False
