"""The forwarding path's Ollama side: the replies of an admitted or refused Ollama call, in Ollama's shapes.

``router.http.forward`` translates the body (``router.http.ollama.requests``), admits and relays the
llama-server request as for any other route, then hands the reply here: errors become ``{"error": ...}``
with the same status and headers, whole answers one JSON object, streams NDJSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping

from router.http.ollama.replies import (
    StreamTranslator,
    Timing,
    error_message,
    idiom_reply,
    whole_reply,
)
from router.http.ollama.requests import Exchange, Kind
from router.http.reply import Reply
from router.shell.ticket import Ticket
from statemachine import ModelState, State, queries

NDJSON = "application/x-ndjson"
_KEPT = ("x-router-model", "retry-after", "x-ratelimit", "vary", "access-control")


def _kept(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower().startswith(_KEPT)}


def ollama_error(reply: Reply) -> Reply:
    """An error reply (any shape) as Ollama's ``{"error": "..."}``, with its status and headers kept."""
    if reply.status < 400 or not isinstance(reply.body, bytes):
        return reply
    body = json.dumps({"error": error_message(reply.body)}).encode()
    headers = {k: v for k, v in reply.headers.items() if k.lower() != "content-length"}
    return Reply(reply.status, {**headers, "content-type": "application/json"}, body)


def _json(status: int, doc: object, headers: Mapping[str, str], stream: bool) -> Reply:
    body = json.dumps(doc).encode() + (b"\n" if stream else b"")
    return Reply(status, {**headers, "content-type": NDJSON if stream else "application/json"}, body)


def timing_of(ticket: Ticket) -> Timing:
    def waited() -> float:
        end = ticket.dispatched_at if ticket.dispatched_at is not None else time.monotonic()
        return end - ticket.queued_at

    return Timing(ticket.queued_at, waited)


def ollama_answer(exchange: Exchange, reply: Reply, ticket: Ticket) -> Reply:
    """The reply to an admitted Ollama call, from the relayed llama-server reply."""
    if reply.status >= 400 and isinstance(reply.body, bytes):
        return ollama_error(reply)
    headers = _kept(reply.headers)
    timing = timing_of(ticket)
    body = reply.body
    if not exchange.stream or exchange.kind in (Kind.LOAD, Kind.UNLOAD):
        kind = NDJSON if exchange.stream else "application/json"
        content = {**headers, "content-type": kind}
        if isinstance(body, bytes):
            return Reply(reply.status, content, _document(exchange, body, timing))
        return Reply(reply.status, content, _read_whole(body, exchange, timing))
    translator = StreamTranslator(exchange, timing)
    return Reply(reply.status, {**headers, "content-type": NDJSON}, _ndjson(body, translator))


def _document(exchange: Exchange, body: bytes, timing: Timing) -> bytes:
    """The Ollama document for a replica's whole answer ``body`` (the idioms' answer ignores it)."""
    if exchange.kind in (Kind.LOAD, Kind.UNLOAD):
        doc = idiom_reply(exchange)
    else:
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            parsed = None
        if isinstance(parsed, dict):
            doc = whole_reply(exchange, parsed, timing)
        else:
            doc = {"error": f"the replica of '{exchange.model}' answered something that is not JSON"}
    return json.dumps(doc).encode() + (b"\n" if exchange.stream else b"")


async def _read_whole(
    chunks: AsyncIterator[bytes], exchange: Exchange, timing: Timing
) -> AsyncIterator[bytes]:
    """A whole answer relayed in chunks, read to its end and given as one Ollama document."""
    parts = []
    try:
        async for chunk in chunks:
            parts.append(chunk)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    yield _document(exchange, b"".join(parts), timing)


async def _ndjson(chunks: AsyncIterator[bytes], translator: StreamTranslator) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            lines = translator.feed(chunk)
            if lines:
                yield lines
            # Read on after the last event: the relay ends its request when the replica's reply has ended.
        rest = translator.close()
        if rest:
            yield rest
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def unloaded_answer(exchange: Exchange, state: State, models: tuple[str, ...]) -> Reply | None:
    """The answer to the unload idiom for ``models`` (a model, or a pool's members) when none of them is
    loaded: nothing to do, so nothing is loaded for it. None when one is: the call goes on with keep_alive 0,
    which stops it once idle."""
    if exchange.kind is not Kind.UNLOAD:
        return None
    if any(queries.model_state(state, m) is not ModelState.UNLOADED for m in models):
        return None
    return _json(200, idiom_reply(exchange), {}, exchange.stream)
