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


async def ollama_answer(exchange: Exchange, reply: Reply, ticket: Ticket) -> Reply:
    """The reply to an admitted Ollama call, from the relayed llama-server reply. A whole answer is read to
    its end first, so that a replica that broke off in the middle is answered 502, not 200."""
    if reply.status >= 400 and isinstance(reply.body, bytes):
        return ollama_error(reply)
    headers = _kept(reply.headers)
    timing = timing_of(ticket)
    body = reply.body
    if exchange.stream and exchange.kind not in (Kind.LOAD, Kind.UNLOAD):
        translator = StreamTranslator(exchange, timing)
        return Reply(reply.status, {**headers, "content-type": NDJSON}, _ndjson(body, translator))
    whole = body if isinstance(body, bytes) else await _read_all(body)
    status, doc = _document(exchange, whole, timing)
    data = json.dumps(doc).encode() + (b"\n" if exchange.stream else b"")
    return Reply(status, {**headers, "content-type": NDJSON if exchange.stream else "application/json"}, data)


def _document(exchange: Exchange, body: bytes, timing: Timing) -> tuple[int, dict[str, object]]:
    """The status and Ollama document for a replica's whole answer (the idioms' answer ignores it)."""
    if exchange.kind in (Kind.LOAD, Kind.UNLOAD):
        return 200, idiom_reply(exchange)
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        parsed = None
    if not isinstance(parsed, dict):
        return 502, {"error": f"the replica of '{exchange.model}' broke off its answer or answered no JSON"}
    return 200, whole_reply(exchange, parsed, timing)


async def _read_all(chunks: AsyncIterator[bytes]) -> bytes:
    """A body relayed in chunks, read to its end (and closed, which ends its request)."""
    parts = []
    try:
        async for chunk in chunks:
            parts.append(chunk)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    return b"".join(parts)


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
