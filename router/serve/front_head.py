"""The head of a request the router's HTTP/1.1 front serves itself, parsed with llhttp (httptools).

The front takes the plain case, which is nearly every request a client sends: HTTP/1.1 or 1.0, a target in
origin form (``/path?query``), a body framed by one Content-Length or none. Anything else — a chunked
body, an upgrade, ``CONNECT``, an absolute or ``*`` target, a missing or repeated Host, a head llhttp
refuses — is left to hypercorn, which answers it as before, errors included.
"""

from __future__ import annotations

from urllib.parse import unquote

import attrs
import httptools

HEAD_END = b"\r\n\r\n"
_PASSED_ON = frozenset((b"transfer-encoding", b"upgrade"))


@attrs.frozen
class RequestHead:
    """What the front needs of a request's head; ``length``: its body's size in bytes; ``expects``: the
    client waits for ``100 Continue`` before it sends the body."""

    method: str
    path: str
    raw_path: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    version: str
    keep_alive: bool
    length: int
    expects: bool = False


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


def request_head(data: bytes) -> RequestHead | None:
    """The head ``data`` (through its blank line) if the front serves it, else None (hypercorn's)."""
    collected = _Collected()
    parser = httptools.HttpRequestParser(collected)
    try:
        parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    version = parser.get_http_version()
    method = parser.get_method()
    url = collected.url
    if not collected.complete or version not in ("1.1", "1.0") or method == b"CONNECT":
        return None
    if not url.startswith(b"/") or b"#" in url or not url.isascii():
        return None
    raw_path, _, query = url.partition(b"?")
    length = lengths = hosts = 0
    keep_alive = version == "1.1"  # HTTP/1.0 connections end after each reply, as hypercorn's h11 ends them
    expects = False
    for name, value in collected.headers:
        if name == b"host":
            hosts += 1
        elif name == b"connection":
            if b"close" in (token.strip() for token in value.lower().split(b",")):
                keep_alive = False
        elif name in _PASSED_ON:
            return None
        elif name == b"expect":
            if value.lower() != b"100-continue" or version != "1.1":
                return None
            expects = True
        elif name == b"content-length":
            lengths += 1
            if lengths > 1 or not value.isdigit():
                return None
            length = int(value)
    if hosts > 1 or (hosts == 0 and version == "1.1"):  # HTTP/1.1 requires one Host; hypercorn refuses it
        return None
    path = unquote(raw_path.decode("ascii"), errors="replace")
    return RequestHead(
        method.decode("ascii"), path, raw_path, query, collected.headers, version, keep_alive, length, expects
    )
