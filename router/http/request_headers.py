"""Request headers as the router checks them and passes them on.

hypercorn (h11) already refuses NUL, CR, LF and the other whitespace controls in header values with a
bare 400 of its own. The rest of the C0 controls and DEL get through to the router, and llama-server
(cpp-httplib) answers a request carrying one with an empty 400: the router refuses such a request itself,
in the OpenAI shape, naming the header. Bytes 0x80-0xFF (obs-text) are allowed; the server decodes them as
Latin-1 and ``as_sent`` encodes them back, so they reach the replica unchanged.

Headers are limited to ``HEADERS_LIMIT`` (64 KiB) in all. h11 enforces that only while a request's head is
still arriving in pieces (with a bare 431); a head that arrives whole is measured here and answered 431 in
the OpenAI shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

HEADERS_LIMIT = 64 * 1024
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


def headers_too_large(headers: Iterable[tuple[str, str]]) -> str | None:
    """The message when the headers hold more than HEADERS_LIMIT bytes, else None."""
    size = sum(len(name) + len(value) + 4 for name, value in headers)
    if size <= HEADERS_LIMIT:
        return None
    return f"the request headers hold {size} bytes; the limit is {HEADERS_LIMIT // 1024} KiB"


def bad_header(headers: Iterable[tuple[str, str]]) -> str | None:
    """The message for the first header whose value holds a control character (tab aside), else None."""
    for name, value in headers:
        found = _CONTROL.search(value)
        if found is not None:
            return (
                f"header '{name}' holds the control character 0x{ord(found.group()):02x}; header values "
                "may only hold visible characters, spaces and tabs"
            )
    return None


def as_sent(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Headers for httpx as the client sent them (names and values were decoded as Latin-1)."""
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
