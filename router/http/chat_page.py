"""``/chat/{model}/``: the web UI of a model's own llama-server, reached through the desk.

What works:

- ``GET /chat/{model}`` redirects to ``/chat/{model}/`` so that the page's relative links resolve below it.
- ``GET /chat/{model}/`` of a llama-server built without its web UI (its page answers 404) redirects to
  ``/talk?model={model}``, the router's own chat page.
- ``GET /chat/{model}/...`` (the page, its assets, ``props``, ``slots``, ``v1/models`` ...) goes to a ready
  replica of the model. When none is ready, the request is admitted like any other (so the model is loaded
  on demand, possibly evicting another) and passed through once the replica answers. These reads hold no
  slot while they are relayed. ``Accept-Encoding`` and ``Content-Encoding`` pass unchanged, because
  llama-server serves its page compressed.
- ``POST /chat/{model}/...`` (completions, tokenize, ...) is admitted through the scheduler and relayed
  exactly like the forwarded API, streams and keep-alives included; it shows in the history with endpoint
  ``/chat``.

Limits: the UI must call its API with relative paths (llama-server's bundled UI does); absolute paths such
as ``/v1/chat/completions`` reach the router's own API, which needs the model named in the body. When the
router requires an API key, a browser cannot send one for the page itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import trio
from quart import Response, g, redirect, request
from quart_trio import QuartTrio

from router.config.load import resolve_name
from router.http.admission import check_client, current_client
from router.http.browser_guard import Refusal, drop_cors
from router.http.errors import HttpCode, error_response, unknown_model
from router.http.prefix_key import request_chain
from router.http.proxy import (
    HOP_BY_HOP,
    SAFE_SEGMENT,
    Proxy,
    merged_headers,
    read_replica_error,
    reject_reply,
    upstream_headers,
)
from router.http.reply import to_quart
from router.http.request_body import json_object, read_body
from router.http.request_headers import as_sent
from router.http.scope import scope_refusal
from router.http.upstream import UpstreamError, UpstreamPool, UpstreamResponse
from router.shell.ticket import Ticket
from router.shell.views import Desk
from statemachine import RequestClass

_HOP = frozenset(name.encode() for name in HOP_BY_HOP | {"cookie"})
_REPLY_HOP = frozenset(HOP_BY_HOP | {"cookie"})


async def _relay(upstream: UpstreamResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.chunks():
            yield chunk
    except UpstreamError:
        return
    finally:
        with trio.CancelScope(shield=True):
            await upstream.aclose()


async def _pass_get(pool: UpstreamPool, port: int, rest: str, model: str, name: str) -> Response:
    """Relay a GET below ``/chat/{name}/`` to the replica at ``port``; a build without a web UI sends the
    page's visitor to the router's own chat page."""
    target = "/" + rest + ("?" + request.query_string.decode("latin-1") if request.query_string else "")
    headers = upstream_headers(as_sent(request.headers.items()), _HOP)
    try:
        # A kept-alive connection the replica closed as it was reused is replaced by the pool itself.
        upstream = await pool.send(port, "GET", target, headers)
    except UpstreamError as exc:
        return error_response(HttpCode.UPSTREAM_UNREACHABLE, f"the replica did not answer: {exc}")
    if upstream.status_code == 404 and not rest:
        # A llama-server built without its web UI: the router's own chat page serves the model instead.
        await upstream.aclose()
        return redirect(f"../../talk?model={quote(name, safe='')}", 307)  # type: ignore[return-value]
    if upstream.status_code >= 400:
        error = await read_replica_error(model, upstream)
        return Response(error.body, status=error.status, content_type="application/json")
    headers_out = drop_cors(merged_headers(upstream, _REPLY_HOP))
    return Response(_relay(upstream), status=upstream.status_code, headers=headers_out)


def _admit(
    desk: Desk, model: str, name: str, rest: str, raw: bytes, klass: RequestClass
) -> tuple[Ticket, bool]:
    """Admit a request below ``/chat/{name}/`` in ``klass``: its ticket, and whether it streams. A POST's
    JSON body (if it is JSON) gives the prefix chain and the body a load restores a cached prompt for."""
    doc = None
    stream = False
    prefix: tuple[int, ...] = ()
    if request.method == "POST":
        doc = json_object(raw)  # not JSON, or not within the router's limits: the replica judges it
        stream = doc is not None and doc.get("stream") is True
        if doc is not None:
            enabled = desk.config.router.prefix_affinity
            prefix = request_chain(desk.deployment.settings, enabled, model, doc, "/" + rest)
    ticket = desk.admit(
        model,
        asked=name,
        endpoint="/chat",
        client=request.remote_addr or "",
        tokens=None,
        body=doc,
        prefix=prefix,
        key=current_client().name,
        klass=klass,
    )
    g.ticket = ticket
    return ticket, stream


async def _get_when_loaded(ticket: Ticket, pool: UpstreamPool, rest: str, model: str, name: str) -> Response:
    """A page read that loaded the model: it holds no slot, so its ticket ends once a replica is chosen."""
    decided = False
    try:
        await ticket.decided.wait()
        decided = True
    finally:
        answer = reject_reply(ticket) if decided and ticket.reject is not None else None
        ticket.end(completed=decided and ticket.reject is None)
    if answer is not None:
        return to_quart(answer)
    assert ticket.port is not None
    return await _pass_get(pool, ticket.port, rest, model, name)


def register_chat(app: QuartTrio, desk: Desk, proxy: Proxy) -> None:
    def model_of(name: str) -> str | None:
        target = resolve_name(desk.config, name)  # the current configuration, reloads included
        return target if target in desk.config.models else None

    @app.route("/chat/<name>")
    async def chat_root(name: str) -> Response:
        model = model_of(name)
        if model is None:
            return unknown_model(name, desk.config.models)
        refusal = scope_refusal(desk.config, current_client(), model, name)
        if refusal is not None:
            return error_response(refusal.code, refusal.message)
        return redirect(f"{name}/", 308)  # type: ignore[return-value]

    @app.route("/chat/<name>/", methods=["GET", "POST"], defaults={"rest": ""})
    @app.route("/chat/<name>/<path:rest>", methods=["GET", "POST"])
    async def chat(name: str, rest: str) -> Response:
        model = model_of(name)
        if model is None:
            return unknown_model(name, desk.config.models)
        if rest and any(s in ("", ".", "..") or not SAFE_SEGMENT.match(s) for s in rest.split("/")):
            return error_response(HttpCode.INVALID_PATH, f"'{rest}' is not a plain path below the model")
        raw = await read_body() if request.method == "POST" else b""
        # The page's own files (GET) count against no limit; its API calls (POST) do.
        over_limit = desk.over_limit if request.method == "POST" else _no_limit
        klass = check_client(
            desk.config, current_client(), model, name, request.headers, json_object(raw), over_limit
        )
        if isinstance(klass, Refusal):
            return error_response(klass.code, klass.message, klass.headers)
        if request.method == "GET":
            port = desk.ready_port([model])
            if port is not None:
                return await _pass_get(proxy.pool, port, rest, model, name)
            raw = await read_body()
        ticket, stream = _admit(desk, model, name, rest, raw, klass)
        if request.method == "GET":
            return await _get_when_loaded(ticket, proxy.pool, rest, model, name)
        reply = await proxy.respond(
            ticket,
            method="POST",
            path=rest,
            query=request.query_string,
            body=raw,
            headers=upstream_headers(as_sent(request.headers.items())),
            stream=stream,
        )
        return to_quart(reply)


def _no_limit(key: str) -> None:
    return None
