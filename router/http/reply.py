"""A reply of the forwarding path, independent of the web framework that sends it.

The API's forwarding runs on plain ASGI (``router.http.forward``); the pages that pass requests through to a
replica (``/upstream``, ``/chat``) run on quart. Both build a :class:`Reply` with the same proxy code, and
each sends it its own way: :func:`send_reply` over ASGI, :func:`to_quart` as a quart response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

import attrs

from router.http.errors import ErrorCode, HttpCode, error_body, internal_error_message, status_of

Send = Any  # the ASGI send callable


@attrs.frozen
class Reply:
    """Status, headers and body (bytes, or chunks as they come). ``length``: the body's size where it is known
    in advance (a replica's Content-Length), so that it need not be sent in chunked encoding."""

    status: int
    headers: Mapping[str, str]
    body: bytes | AsyncIterator[bytes]
    length: int | None = None


def json_reply(status: int, doc: Any, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, {"content-type": "application/json", **(headers or {})}, json.dumps(doc).encode())


def error_reply(
    code: ErrorCode, message: str, headers: Mapping[str, str] | None = None, *, given: int | None = None
) -> Reply:
    """An error in the OpenAI shape, with the status ``router.http.errors.ANSWERS`` gives ``code``."""
    return json_reply(status_of(code, given), error_body(code, message, given), headers)


def internal_error_reply(exc: BaseException, method: str, path: str) -> Reply:
    return error_reply(HttpCode.INTERNAL_ERROR, internal_error_message(exc, method, path))


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_reply(send: Send, reply: Reply, extra: list[tuple[bytes, bytes]]) -> None:
    """Send ``reply`` over ASGI with ``extra`` headers. A body given as chunks is closed in the end (its
    generator's cleanup runs even when the send is cancelled)."""
    headers = encode_headers(reply.headers) + extra
    body = reply.body
    if isinstance(body, bytes):
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    async with aclosing(body) as chunks:  # type: ignore[type-var]
        if reply.length is not None:
            headers.append((b"content-length", str(reply.length).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def to_quart(reply: Reply) -> Any:
    """``reply`` as a quart response (chunked when its body comes in chunks)."""
    from quart import Response

    return Response(reply.body, status=reply.status, headers=dict(reply.headers))
