"""Forward one admitted request to its replica and relay the answer without buffering.

The request waits for the scheduler's decision (Dispatch or Reject). A streaming request that waits longer
than a moment gets its response started with SSE comments that keep the connection alive; if it is then
rejected, the stream ends with an error event. Bodies pass byte for byte; the upstream's status and content
type are kept, except that error replies are read whole and answered in the OpenAI shape (see
``router.http.replica_errors``). When the client disconnects, the upstream exchange is closed at once
(llama-server stops generating) and the scheduler is told, which frees the slot.

The answer is a :class:`router.http.reply.Reply`; the caller sends it (plain ASGI for the API, quart for the
pages). Its body, when it comes in chunks, is an async generator whose cleanup closes the upstream exchange
and finishes the ticket: the sender must close it (``send_reply`` and quart both do).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable

import attrs
import trio

from router.http.body_filters import filtered_for
from router.http.browser_guard import drop_cors
from router.http.errors import HttpCode, sse_error, status_of
from router.http.peer_relay import PeerRelay
from router.http.relay_pump import ClientWriter, RelayPump
from router.http.replica_errors import BODY_LIMIT, ReplicaError, shape_replica_error
from router.http.reply import Reply, error_reply
from router.http.request_body import json_object
from router.http.upstream import (
    ConnectFailed,
    UpstreamBroken,
    UpstreamError,
    UpstreamPool,
    UpstreamReply,
    UpstreamResponse,
)
from router.shell.ticket import Ticket
from router.shell.views import RouterView
from statemachine import Dispatch, RejectCode

# A stream whose request is not decided within KEEPALIVE_AFTER seconds (or, as soon as a load it waits for is
# under way, checked every LOAD_CHECK seconds) starts with SSE comments, one every KEEPALIVE_EVERY seconds.
KEEPALIVE_AFTER = 1.0
LOAD_CHECK = 0.25
KEEPALIVE_EVERY = 0.8
# The endpoints whose streams are Anthropic's: their clients also get the protocol's ping events.
_PING_ENDPOINTS = frozenset({"/v1/messages", "/messages"})
_PING = b'event: ping\ndata: {"type": "ping"}\n\n'

# Headers that belong to one connection, or carry the router's own credentials: never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "authorization",
        "x-api-key",
    }
)
# The API relay also asks for plain bodies, so the usage sniffer can read them.
_DROP = HOP_BY_HOP | {"accept-encoding"}
_DROP_BYTES = frozenset(name.encode() for name in _DROP)
_REPLY_DROP = _DROP | {"content-encoding"}
# A path segment below a model: no "..", no encoded slashes or anything else that could escape it.
SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9._~:@!$&'()*+,;=-]+$")


def upstream_headers(
    headers: Iterable[tuple[bytes, bytes]], drop: frozenset[bytes] = _DROP_BYTES
) -> list[tuple[bytes, bytes]]:
    """The client's headers (raw, names in lower case as ASGI gives them) that go on to the replica."""
    return [(k, v) for k, v in headers if k.lower() not in drop]


def merged_headers(upstream: UpstreamReply, drop: frozenset[str]) -> dict[str, str]:
    """The replica's headers without ``drop``; repeated ones joined with commas."""
    out: dict[str, str] = {}
    for raw_name, raw_value in upstream.raw_headers:
        name = raw_name.decode("latin-1")
        if name in drop:
            continue
        value = raw_value.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def reply_headers(upstream: UpstreamReply, model: str | None) -> dict[str, str]:
    """The replica's response headers for the client; its CORS policy is replaced by the router's own."""
    out = drop_cors(merged_headers(upstream, _REPLY_DROP))
    if model is not None:
        out["x-router-model"] = model
    return out


async def read_replica_error(model: str | None, upstream: UpstreamReply) -> ReplicaError:
    """Read a replica's error reply (at most BODY_LIMIT bytes), close it, and shape the answer."""
    try:
        body, complete = await upstream.read(BODY_LIMIT)
    finally:
        with trio.CancelScope(shield=True):
            await upstream.aclose()
    return shape_replica_error(model, upstream.status_code, body, complete)


def reject_reply(ticket: Ticket) -> Reply:
    """The answer to the scheduler's rejection of ``ticket``; its status is also the request's record's."""
    reject = ticket.reject
    assert reject is not None
    retry = reject.code in (RejectCode.QUEUE_FULL, RejectCode.KEY_QUEUE_FULL, RejectCode.SHUTTING_DOWN)
    reply = error_reply(
        reject.code, reject.message, {"Retry-After": "5"} if retry else None, given=reject.peer_status
    )
    ticket.observed.fail(reply.status, reject.message)
    return reply


def _broken(exc: UpstreamError) -> str:
    """Why the replica broke off the exchange, or "" when it did not (it only took too long)."""
    return str(exc) if isinstance(exc, UpstreamBroken) else ""


@attrs.frozen
class Answered:
    """The request was answered without a relay (a rejection, an unreachable replica, a replica's error,
    a peer's answer): ``reply``, and how its ticket ends."""

    reply: Reply
    completed: bool
    broken: str = ""


def _as_event(reply: Reply) -> bytes:
    """An answer given in place of a relay, as the last event of a stream whose head went out already."""
    body = reply.body if isinstance(reply.body, bytes) else b""
    return b"data: " + body + b"\n\n"


def name_member(body: bytes, model: str) -> bytes:
    """A pooled request's body with ``model`` set to the member that serves it, so the reply names it."""
    doc = json_object(body)
    if doc is None:
        return body
    doc["model"] = model
    return json.dumps(doc).encode()


def _target(path: str, query: bytes) -> str:
    target = "/" + path.lstrip("/")
    return target + "?" + query.decode("latin-1") if query else target


# The client's writer for a response whose head has gone out (router.http.relay_pump), or None.
WriterOf = Callable[[], ClientWriter | None]


class Proxy:
    def __init__(
        self, view: RouterView, pool: UpstreamPool, peers: PeerRelay, pump: RelayPump | None = None
    ) -> None:
        self.view = view
        self.pool = pool
        self.peers = peers
        self.pump = pump  # relays streamed bodies whose client gives a writer (None: every body is yielded)

    async def respond(
        self,
        ticket: Ticket,
        *,
        method: str,
        path: str,
        query: bytes,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        stream: bool,
        writer: WriterOf | None = None,
    ) -> Reply:
        """The answer to an admitted request; ``headers``: the client's, as ``upstream_headers`` left them.
        The ticket is ended here when the answer is whole, else by the relay of its body. ``writer``: asked
        once the reply's head has gone out, for a writer of its body straight to the client (the pump
        relays it then, and the body yields nothing, or only a last error event)."""
        ticket.observed.stream = stream
        try:
            if stream:
                await self._decided_or_waiting(ticket)
            else:
                await ticket.decided.wait()
            if not ticket.decided.is_set():
                gen = self._wait_then_relay(ticket, method, path, query, body, headers, writer)
                return Reply(200, {"content-type": "text/event-stream"}, gen)
            opened = await self._open(ticket, method, path, query, body, headers)
        except BaseException:
            ticket.end(completed=False)
            raise
        if isinstance(opened, Answered):
            ticket.end(completed=opened.completed, broken=opened.broken)
            return opened.reply
        sse = (opened.header(b"content-type") or "").startswith("text/event-stream")
        length = opened.header(b"content-length")
        return Reply(
            opened.status_code,
            reply_headers(opened, ticket.model),
            self._relay(ticket, opened, sse, writer),
            length=int(length) if length is not None and length.isdigit() and not sse else None,
        )

    async def _open(
        self,
        ticket: Ticket,
        method: str,
        path: str,
        query: bytes,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> UpstreamReply | Answered:
        """The replica's reply to relay (status below 400), or the answer when there is none to relay."""
        if ticket.reject is not None:
            return Answered(reject_reply(ticket), completed=False)
        target = _target(path, query)
        upstream: UpstreamReply | None = None
        while ticket.peer is not None and upstream is None:
            upstream = await self.peers.open(ticket, method, target, body, headers)
            if upstream is None:
                await ticket.decided.wait()  # the peer failed it: a pool's next member, or the answer
                if ticket.reject is not None:
                    return Answered(reject_reply(ticket), completed=False)
        if upstream is None:
            pooled = ticket.target in self.view.state.settings.pools
            if pooled and ticket.model is not None and ticket.model != ticket.target:
                body = name_member(body, ticket.model)
            if ticket.model is not None:  # the serving model's set_params / strip_params
                body = filtered_for(self.view.config.models.get(ticket.model), body)
            try:
                upstream = await self._connect(ticket, method, target, headers, body)
            except UpstreamError as exc:
                message = f"the replica of '{ticket.model}' did not answer: {exc}"
                reply = error_reply(HttpCode.UPSTREAM_UNREACHABLE, message)
                ticket.observed.fail(reply.status, message)
                return Answered(reply, True, _broken(exc))
            if upstream is None:
                return Answered(reject_reply(ticket), completed=False)
            ticket.observed.status = upstream.status_code
        if upstream.status_code >= 400:
            error = await read_replica_error(ticket.model, upstream)
            ticket.observed.fail(error.status, error.message)
            return Answered(self._error_reply(ticket, upstream, error), completed=True)
        return upstream

    async def _connect(
        self, ticket: Ticket, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamReply | None:
        """Send the request to its replica; when nothing listens there any more (the replica died a moment
        ago), or it was killed as unresponsive before it answered, the ticket waits for another one. None: the
        scheduler answered it instead."""
        while True:
            try:
                if ticket.port is None:  # its replica exited as it was chosen: nothing to connect to
                    raise ConnectFailed("the replica has no port any more")
                return await self.pool.send(ticket.port, method, target, headers, body)
            except ConnectFailed as exc:
                if not ticket.refused(f"connection refused: {exc}"):
                    raise
            except UpstreamError as exc:
                # Killed as unresponsive before it answered: nothing reached the client, the replacement may.
                frozen = self._unresponsive(ticket)
                if not frozen or not ticket.refused(f"the replica stopped answering: {exc}"):
                    raise
            await ticket.decided.wait()
            if ticket.reject is not None and ticket.refused("the replica exited", again=True):
                await ticket.decided.wait()  # the exit reached the scheduler before the refusal
            if ticket.reject is not None:
                return None

    def _unresponsive(self, ticket: Ticket) -> bool:
        """Whether the replica ``ticket`` was sent to was killed for leaving its /health unanswered."""
        dispatch = ticket.dispatch
        info = self.view.replica_info(dispatch.replica) if isinstance(dispatch, Dispatch) else None
        return info is not None and info.unresponsive

    async def _relay(
        self, ticket: Ticket, upstream: UpstreamReply, sse: bool, writer: WriterOf | None = None
    ) -> AsyncIterator[bytes]:
        # No cancel scope spans a yield here: the exchange ends by itself when the replica goes away.
        completed = False
        sniffer = ticket.observed.sniff(sse=sse)
        try:
            try:
                pumped = self._pumped(upstream, writer)
                if pumped is not None:
                    pump, response, direct = pumped
                    await pump.relay(response, direct, sniffer.feed, self.pool.read_timeout)
                else:
                    async for chunk in upstream.chunks():
                        sniffer.feed(chunk)
                        yield chunk
                completed = True
            except UpstreamError as exc:
                completed = True
                text = self._failure_text(ticket, exc)
                ticket.observed.fail(status_of(HttpCode.REPLICA_FAILED), text)
                # The scheduler hears of it before the client does, so the client's next request cannot
                # reach this replica (it may be dying) before its exit is reported.
                with trio.CancelScope(shield=True):
                    await upstream.aclose()
                ticket.end(completed=True, broken=_broken(exc))
                if sse:
                    yield sse_error(HttpCode.REPLICA_FAILED, text)
        finally:
            with trio.CancelScope(shield=True):
                await upstream.aclose()
            ticket.end(completed=completed)

    def _pumped(
        self, upstream: UpstreamReply, writer: WriterOf | None
    ) -> tuple[RelayPump, UpstreamResponse, ClientWriter] | None:
        """The pump, the replica's reply and the client's writer, when the pump can relay this body."""
        if writer is None or self.pump is None or not isinstance(upstream, UpstreamResponse):
            return None
        direct = writer()
        return None if direct is None else (self.pump, upstream, direct)

    @staticmethod
    def _error_reply(ticket: Ticket, upstream: UpstreamReply, error: ReplicaError) -> Reply:
        if error.wrapped:
            headers = {"content-type": "application/json"}
            if ticket.model is not None:
                headers["x-router-model"] = ticket.model
        else:
            headers = reply_headers(upstream, ticket.model)
        return Reply(error.status, headers, error.body)

    def _failure_text(self, ticket: Ticket, exc: BaseException) -> str:
        if ticket.rejection is not None:
            return ticket.rejection.message
        dispatch = ticket.dispatch
        info = self.view.replica_info(dispatch.replica) if isinstance(dispatch, Dispatch) else None
        if info is not None and info.stop_reason is not None:
            return f"the replica of '{ticket.model}' was stopped while answering: {info.stop_reason}"
        return f"the replica of '{ticket.model}' broke off the reply: {exc}"

    async def _wait_then_relay(
        self,
        ticket: Ticket,
        method: str,
        path: str,
        query: bytes,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        writer: WriterOf | None = None,
    ) -> AsyncIterator[bytes]:
        try:
            while not ticket.decided.is_set():
                yield self._keepalive(ticket)
                with trio.move_on_after(KEEPALIVE_EVERY):
                    await ticket.decided.wait()
            opened = await self._open(ticket, method, path, query, body, headers)
        except BaseException:
            ticket.end(completed=False)
            raise
        if isinstance(opened, Answered):
            ticket.end(completed=opened.completed, broken=opened.broken)
            yield _as_event(opened.reply)
            return
        sse = (opened.header(b"content-type") or "").startswith("text/event-stream")
        relay = self._relay(ticket, opened, sse, writer)
        try:
            async for chunk in relay:
                yield chunk
        finally:
            with trio.CancelScope(shield=True):
                await relay.aclose()

    async def _decided_or_waiting(self, ticket: Ticket) -> None:
        """Return once ``ticket`` is decided, or KEEPALIVE_AFTER seconds have passed, or a load it waits for
        is under way (its stream then starts with the load's progress). A request relayed by another router
        waits the whole KEEPALIVE_AFTER: that router may still send it elsewhere until its first byte."""
        deadline = trio.current_time() + KEEPALIVE_AFTER
        while not ticket.decided.is_set() and trio.current_time() < deadline:
            with trio.move_on_after(min(LOAD_CHECK, deadline - trio.current_time())):
                await ticket.decided.wait()
            if ticket.decided.is_set():
                return
            if not ticket.local_only and self.view.awaited_load(ticket.rid) is not None:
                return

    def _keepalive(self, ticket: Ticket) -> bytes:
        """An SSE comment on the wait: the load it waits for with its progress, the time waited and the
        position in the queue; an Anthropic stream's also carries a ping event."""
        waited = f"waiting for '{ticket.target}' {time.monotonic() - ticket.queued_at:.0f} s"
        position = self.view.queue_position(ticket.rid)
        if position is not None:
            waited += f", queue position {position}"
        load = self.view.awaited_load(ticket.rid)
        if load is None:
            text = f": {waited}"
        else:
            model, progress = load
            text = f": loading {model} {progress.percent}% {progress.seconds:.0f} s ({waited})"
        comment = text.replace("\n", " ").encode() + b"\n\n"
        return comment + _PING if ticket.endpoint in _PING_ENDPOINTS else comment
