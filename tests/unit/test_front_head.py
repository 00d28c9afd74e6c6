"""Which request heads the router's front serves itself, and what it reads of them; everything else is
hypercorn's (None)."""

from __future__ import annotations

import pytest

from router.serve.front_head import request_head


def head(first: str, *lines: str) -> bytes:
    return ("\r\n".join((first, "Host: x", *lines)) + "\r\n\r\n").encode()


def test_a_plain_request_is_the_fronts() -> None:
    got = request_head(head("POST /v1/chat/completions?a=1 HTTP/1.1", "Content-Length: 12", "X-Y: z"))
    assert got is not None
    assert (got.method, got.path, got.raw_path, got.query, got.version, got.expects) == (
        "POST",
        "/v1/chat/completions",
        b"/v1/chat/completions",
        b"a=1",
        "1.1",
        False,
    )
    assert (got.length, got.keep_alive) == (12, True)
    assert got.headers == [(b"host", b"x"), (b"content-length", b"12"), (b"x-y", b"z")]


def test_other_methods_encoded_paths_and_expected_bodies() -> None:
    page = request_head(head("GET /v1/models/a%20b HTTP/1.1"))
    assert page is not None and (page.method, page.path, page.raw_path) == (
        "GET",
        "/v1/models/a b",
        b"/v1/models/a%20b",
    )
    waits = request_head(
        head("POST /v1/chat/completions HTTP/1.1", "Expect: 100-continue", "Content-Length: 3")
    )
    assert waits is not None and waits.expects and waits.length == 3


def test_keep_alive_follows_the_version_and_connection_header() -> None:
    close = request_head(head("POST /api/chat HTTP/1.1", "Connection: close"))
    old = request_head(b"POST /api/chat HTTP/1.0\r\nContent-Length: 0\r\n\r\n")  # no Host: fine
    old_kept = request_head(head("POST /api/chat HTTP/1.0", "Connection: keep-alive"))
    assert close is not None and old is not None and old_kept is not None
    assert (close.keep_alive, old.keep_alive, old_kept.keep_alive) == (False, False, False)
    assert close.length == 0  # no Content-Length: no body


@pytest.mark.parametrize(
    "data",
    [
        head("CONNECT x:443 HTTP/1.1"),
        head("OPTIONS * HTTP/1.1"),
        head("POST http://x/v1/chat/completions HTTP/1.1"),
        head("GET /caf\u00e9 HTTP/1.1"),
        head("POST /v1/chat/completions HTTP/2.0"),
        head("POST /v1/chat/completions HTTP/1.1", "Transfer-Encoding: chunked"),
        head("POST /v1/chat/completions HTTP/1.1", "Content-Length: 3", "Transfer-Encoding: chunked"),
        head("POST /v1/chat/completions HTTP/1.1", "Content-Length: 3", "Content-Length: 3"),
        head("POST /v1/chat/completions HTTP/1.1", "Content-Length: +3"),
        head("POST /v1/chat/completions HTTP/1.1", "Expect: something-else", "Content-Length: 3"),
        head("POST /v1/chat/completions HTTP/1.1", "Upgrade: h2c", "Connection: upgrade"),
        head("POST /v1/chat/completions HTTP/1.1", "Bad Header: x"),
        head("POST /v1/chat/completions HTTP/1.1", "X: a\rb"),
        head("POST /v1/chat/completions HTTP/1.1", "Host: y"),  # two Host headers
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n",  # HTTP/1.1 without a Host
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",  # the head is not complete
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS to a plain HTTP port
    ],
)
def test_everything_else_is_left_to_hypercorn(data: bytes) -> None:
    assert request_head(data) is None
