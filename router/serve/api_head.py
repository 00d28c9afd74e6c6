"""The head of a request the API front serves itself, parsed with llhttp (httptools).

The front takes the plain case only: an HTTP/1.1 or 1.0 ``POST`` to one of the forwarded paths, its body
framed by one Content-Length (or none). Anything else — another method or path, a chunked or expected
body, an upgrade, a percent-encoded path, a head llhttp refuses — is left to hypercorn, which answers it as
before, errors included.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import httptools

HEAD_END = b"\r\n\r\n"
_PASSED_ON = frozenset((b"transfer-encoding", b"expect", b"upgrade"))


@attrs.frozen
class ApiHead:
    """What the front needs of a request's head; ``length``: its body's size in bytes."""

    path: str
    raw_path: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    version: str
    keep_alive: bool
    length: int


class _Collected:
    """httptools' callbacks for one head."""

    __slots__ = ("complete", "headers", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.complete = True


def api_head(data: bytes, served: Callable[[str], bool]) -> ApiHead | None:
    """The head ``data`` (through its blank line) if the front serves it, else None. ``served``: whether a
    POST to a path is the API's."""
    if not data.startswith(b"POST /"):
        return None
    collected = _Collected()
    parser = httptools.HttpRequestParser(collected)
    try:
        parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    version = parser.get_http_version()
    if not collected.complete or version not in ("1.1", "1.0"):
        return None
    raw_path, _, query = collected.url.partition(b"?")
    if b"%" in raw_path or b"#" in collected.url:
        return None
    path = raw_path.decode("ascii", "replace")
    if not served(path):
        return None
    length = 0
    lengths = 0
    keep_alive = version == "1.1"  # HTTP/1.0 connections end after each reply, as hypercorn's h11 ends them
    hosts = 0
    for name, value in collected.headers:
        if name == b"host":
            hosts += 1
        elif name == b"connection" and b"close" in (token.strip() for token in value.lower().split(b",")):
            keep_alive = False
        elif name in _PASSED_ON:
            return None
        if name == b"content-length":
            lengths += 1
            if lengths > 1 or not value.isdigit():
                return None
            length = int(value)
    if hosts > 1 or (hosts == 0 and version == "1.1"):  # HTTP/1.1 requires one Host; hypercorn refuses it
        return None
    return ApiHead(path, raw_path, query, collected.headers, version, keep_alive, length)
