"""The API's forwarding path on plain ASGI: every ``POST`` to a forwarded endpoint, from the request's head to
the last relayed byte, without the web framework in between.

Everything else (pages, status, admin actions, ``/upstream`` and ``/chat``) goes to the quart app. The
checks and answers are the same as there, in the same order: browser safety (``browser_guard``), header
limits, the API key, the body (size, time, JSON, field types), the model's name; then the request is
admitted and relayed by ``router.http.proxy``. A refusal before admission closes the connection when the
request's body was left unread, and is recorded in the history. While a request is served, the client's
side of the connection is watched: when the client goes away, serving is cancelled at once (the upstream
exchange closes, the slot is freed).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import trio

from router.config.load import Config
from router.http.access import Client
from router.http.admission import HeadCheck, check_client, check_head, resolve_target
from router.http.browser_guard import Refusal, cors_reply_headers
from router.http.errors import HttpCode
from router.http.keep_alive import keep_alive_of
from router.http.ollama.dialect import ollama_answer, ollama_error, unloaded_answer
from router.http.ollama.requests import PATHS as OLLAMA_PATHS
from router.http.ollama.requests import Exchange, translate
from router.http.prefix_key import request_chain
from router.http.proxy import Proxy, WriterOf, upstream_headers
from router.http.relay_pump import ClientWriter
from router.http.reply import Reply, error_reply, internal_error_reply, send_reply
from router.http.request_body import BodyError, check_fields, parse_object
from router.http.scope import out_of_scope
from router.http.tokens import exact_prompt_tokens, prompt_upper_bound, requested_output
from router.http.unadmitted import unadmitted_record
from router.shell.peers import HOP_HEADER
from router.shell.views import Desk
from statemachine import serving_models

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The HTTP server's watch of a client leaving (``router.serve.front_watch``): given a request's ASGI receive
# (its body read) and a cancel scope, it cancels the scope when the client leaves, and gives what stops the
# watch; None where it cannot watch that receive.
WatchLeaving = Callable[[Receive, trio.CancelScope], Callable[[], None] | None]

BODY_TIMEOUT = 120.0
HOP = HOP_HEADER.encode()

FORWARDED = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/completion",
    "/v1/embeddings",
    "/embeddings",
    "/v1/rerank",
    "/rerank",
    "/v1/reranking",
    "/reranking",
    "/infill",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/responses",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/chat/completions/input_tokens",
)
_FORWARDED = frozenset(FORWARDED)
# Ollama's calls: translated to one of the above and answered in Ollama's shapes (router.http.ollama).
_OLLAMA = frozenset(OLLAMA_PATHS)
_SERVED = _FORWARDED | _OLLAMA


class _ClientLeft(Exception):
    """The client closed the connection while its request's body was arriving."""


class Forwarder:
    """Serves one forwarded API request per call (an ASGI application for those paths only)."""

    def __init__(
        self,
        config: Config,
        desk: Desk,
        proxy: Proxy,
        client: httpx.AsyncClient,
        writer_for: Callable[[Send], ClientWriter | None] | None = None,
        leave_watch: WatchLeaving | None = None,
    ) -> None:
        """``writer_for``: the HTTP server's writer of a started response's body, given its ASGI send (for
        the relay pump); None sends every body through ASGI. ``leave_watch``: the HTTP server's watch of
        its clients leaving (None: a task per request waits for ``http.disconnect``)."""
        self.desk = desk
        self.writer_for = writer_for
        self.leave_watch = leave_watch
        self.proxy = proxy
        self.client = client  # for exact token counts of pooled requests
        self.bind_host = config.router.host  # fixed until a restart, like the listening socket
        self.body_limit = config.router.max_body_mib * 1024 * 1024  # fixed at startup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived, arrived_mono = time.time(), time.monotonic()
        path: str = scope["path"]
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers]
        first = _first_values(pairs)  # each header's first value, by its name
        client = scope["client"][0] if scope.get("client") else ""
        settings = self.desk.config.router
        check = check_head(
            "POST",
            path,
            first,
            pairs,
            bind_host=self.bind_host,
            settings=settings,
            api_keys=self.desk.deployment.api_keys,
            named=self.desk.config.keys,
        )
        verdict = check.verdict
        cors_origins = settings.cors_origins

        async def answer(reply: Reply, admitted: bool = False) -> None:
            shown = ollama_error(reply) if path in _OLLAMA else reply
            headers = dict(shown.headers)
            cors_reply_headers(headers, verdict.cors_origin, cors_origins)
            await send_reply(send, Reply(shown.status, headers, shown.body, shown.length), [])
            if not admitted and reply.status >= 400 and isinstance(reply.body, bytes):
                record = unadmitted_record(
                    at=arrived,
                    arrived_mono=arrived_mono,
                    client=client,
                    endpoint=path,
                    asked=None,
                    status=reply.status,
                    body=reply.body,
                    key=check.client.name,
                )
                self.desk.publish(record)

        refusal = self._refusal(check)
        if refusal is not None:
            if _has_body(first):  # its body is still on the connection: do not reuse it
                refusal = Reply(refusal.status, {**refusal.headers, "connection": "close"}, refusal.body)
            await answer(refusal)
            return
        try:
            raw = await self._read_body(receive, first)
        except _ClientLeft:
            return
        if isinstance(raw, Reply):
            await answer(raw)
            return
        started = False

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        async with self._cancelled_when_left(receive):
            try:
                query = scope.get("query_string", b"")
                writer_for = self.writer_for
                writer = None if writer_for is None else lambda: writer_for(send)
                sender = (client, check.client)
                reply, admitted = await self._serve(path, raw, (raw_headers, first), sender, query, writer)
                if admitted:
                    headers = dict(reply.headers)
                    cors_reply_headers(headers, verdict.cors_origin, cors_origins)
                    await send_reply(tracked_send, Reply(reply.status, headers, reply.body, reply.length), [])
                else:
                    await answer(reply)
            except Exception as exc:
                if started:
                    raise
                await answer(internal_error_reply(exc, "POST", path))

    @contextlib.asynccontextmanager
    async def _cancelled_when_left(self, receive: Receive) -> AsyncIterator[None]:
        """What runs inside is cancelled as soon as the client leaves: the HTTP server's own watch sees it
        where it has one (``leave_watch``), else a task waiting for ``http.disconnect``."""
        scope = trio.CancelScope()
        stop = None if self.leave_watch is None else self.leave_watch(receive, scope)
        if stop is not None:
            try:
                with scope:
                    yield
            finally:
                stop()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()

    def _refusal(self, check: HeadCheck) -> Reply | None:
        """The answer to a request refused on its head alone (browser safety, headers, key), else None."""
        refusal = check.refusal
        if refusal is None:
            return None
        return error_reply(refusal.code, refusal.message, refusal.headers)

    async def _read_body(self, receive: Receive, heads: dict[str, str]) -> bytes | Reply:
        limit = self.body_limit
        declared = heads.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return self._too_large()
        parts: list[bytes] = []
        size = 0
        with trio.move_on_after(BODY_TIMEOUT):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientLeft()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    return self._too_large()
                parts.append(chunk)
                if not message.get("more_body", False):
                    return parts[0] if len(parts) == 1 else b"".join(parts)
        message = f"the request body did not arrive within {BODY_TIMEOUT:g} s"
        return error_reply(HttpCode.REQUEST_TIMEOUT, message, {"connection": "close"})

    def _too_large(self) -> Reply:
        mib = self.body_limit // (1024 * 1024)
        message = f"request body is larger than max_body_mib = {mib} MiB; send less or raise the limit"
        # The unread rest of the body is still on the connection: close it rather than reuse it.
        return error_reply(HttpCode.REQUEST_TOO_LARGE, message, {"connection": "close"})

    async def _serve(
        self,
        path: str,
        raw: bytes,
        sent_headers: tuple[list[tuple[bytes, bytes]], dict[str, str]],
        sender: tuple[str, Client],
        query: bytes,
        writer: WriterOf | None = None,
    ) -> tuple[Reply, bool]:
        """The answer, and whether the request was admitted (else the answer is a refusal). ``sent_headers``:
        the headers as sent, and each one's first value by name; ``sender``: the client's address and who
        its key names."""
        client, who = sender
        raw_headers, heads = sent_headers
        endpoint = path
        exchange: Exchange | None = None
        try:
            body = parse_object(raw)
            check_fields(body)
            keep_alive = keep_alive_of(body, self.desk.config.router.max_keep_alive)
            if path in _OLLAMA:
                exchange = translate(path, body)
                path, body = exchange.path, exchange.body
                raw = json.dumps(body).encode()
        except BodyError as exc:
            return error_reply(exc.code, str(exc)), False
        # Resolved as the client's path names it: an Ollama load or unload idiom may name a pool.
        target, problem = self._resolve(body.get("model"), endpoint)
        if problem is not None:
            return problem, False
        assert target is not None
        desk = self.desk
        asked = body.get("model")
        klass = check_client(desk.config, who, target, asked, heads, body, desk.over_limit)
        if isinstance(klass, Refusal):
            return error_reply(klass.code, klass.message, klass.headers), False
        if exchange is not None:
            nothing_to_do = unloaded_answer(
                exchange, desk.state, serving_models(desk.deployment.settings, target)
            )
            if nothing_to_do is not None:
                return nothing_to_do, True
        ticket = desk.admit(
            target,
            asked=asked if isinstance(asked, str) else None,
            endpoint=endpoint,
            client=client,
            tokens=await self._needed_tokens(target, body),
            body=body,
            prefix=request_chain(
                desk.deployment.settings, desk.config.router.prefix_affinity, target, body, path
            ),
            local_only=any(name == HOP for name, _ in raw_headers),
            key=who.name,
            klass=klass,
            outside=self._outside(who, target),
            keep_alive=keep_alive,
        )
        reply = await self.proxy.respond(
            ticket,
            method="POST",
            path=path,
            query=query,
            body=raw,
            headers=upstream_headers(raw_headers),
            stream=body.get("stream") is True,
            writer=writer if exchange is None else None,  # Ollama's replies are translated chunk by chunk
        )
        if exchange is not None:
            reply = await ollama_answer(exchange, reply, ticket)
        limits = desk.limit_headers(who.name)
        if limits:
            reply = Reply(reply.status, {**reply.headers, **limits}, reply.body, reply.length)
        return reply, True

    def _outside(self, who: Client, target: str) -> frozenset[str]:
        """The members of pool ``target`` that ``who`` may not use (none for a model)."""
        pool = self.desk.state.settings.pools.get(target)
        return frozenset() if pool is None else out_of_scope(self.desk.config, who, pool.members)

    def _resolve(self, name: Any, path: str) -> tuple[str | None, Reply | None]:
        target, refusal = resolve_target(self.desk.config, self.desk.peer_model, name, path)
        if refusal is not None:
            return None, error_reply(refusal.code, refusal.message, refusal.headers)
        return target, None

    async def _needed_tokens(self, target: str, body: dict[str, Any]) -> int | None:
        desk = self.desk
        output = requested_output(body)
        if target not in desk.config.pools:
            return output or None
        upper = prompt_upper_bound(body) + output
        members = serving_models(desk.deployment.settings, target)  # the members served here
        if not members or upper <= min(desk.launches[m].ctx_per_slot for m in members):
            return upper
        port = desk.ready_port(members)
        exact = None if port is None else await exact_prompt_tokens(self.client, port, body)
        return upper if exact is None else exact + output


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def _first_values(pairs: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in pairs:
        out.setdefault(name, value)
    return out


def _has_body(heads: dict[str, str]) -> bool:
    return heads.get("content-length", "0") not in ("", "0") or "transfer-encoding" in heads


class DataPath:
    """The router's ASGI application: forwarded API requests to the Forwarder, the rest to ``app``."""

    def __init__(self, app: ASGIApp, forwarder: Forwarder) -> None:
        self.app = app
        self.forwarder = forwarder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in _SERVED:
            await self.forwarder(scope, receive, send)
        else:
            await self.app(scope, receive, send)
