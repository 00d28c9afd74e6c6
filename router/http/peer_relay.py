"""Requests the scheduler forwarded to a peer: sent over HTTP with the peer's key and the hop mark, relayed
through the same path as a replica's reply.

A failure before any byte reached the client — no connection, no answer in time, or a 5xx reply — goes
back to the scheduler (``Router.peer_failed``), which sends a pooled request to its next member or answers
it; a connection failure also takes the peer out of service until its next good /v1/models read. A reply
the peer has begun is relayed to its end, byte for byte, like a replica's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import trio

from router.http.replica_errors import BODY_LIMIT
from router.http.request_class import CLASS_HEADER
from router.http.upstream import ReplyTimeout, UpstreamBroken, UpstreamReply
from router.shell.peers import describe_failure, peer_headers
from router.shell.ticket import Ticket
from router.shell.views import RouterView

LOOP_DETECTED = 508  # the peer refused a second hop: no capacity miss, the answer itself
# Client headers the router sets itself on a request to a peer.
_REPLACED = frozenset({b"accept-encoding", CLASS_HEADER.encode()})


class PeerResponse(UpstreamReply):
    """A peer's reply, read by the proxy like a replica's."""

    def __init__(self, response: httpx.Response, read_timeout: float) -> None:
        self._response = response
        self._timeout = read_timeout
        self.status_code = response.status_code
        self.reason = response.reason_phrase
        self.raw_headers = [(k.lower(), v) for k, v in response.headers.raw]
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                if chunk:
                    yield chunk
        except httpx.TimeoutException:
            raise ReplyTimeout(self._timeout) from None
        except httpx.HTTPError as exc:
            raise UpstreamBroken(f"the peer broke off the reply: {exc}") from None
        self._done = True

    async def aclose(self) -> None:
        await self._response.aclose()


class PeerRelay:
    def __init__(self, view: RouterView, client: httpx.AsyncClient, read_timeout: float) -> None:
        self.view = view
        self.client = client  # for other routers: no proxy from the environment between them
        self.read_timeout = read_timeout

    async def open(
        self, ticket: Ticket, method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> PeerResponse | None:
        """Send ``ticket``'s request to its peer: the reply, or None when the peer failed it (the scheduler
        has been told, through the ticket, and decides again)."""
        name, model = ticket.peer, ticket.model
        assert name is not None and model is not None
        peer = self.view.config.peers.get(name)
        if peer is None:
            ticket.peer_failed("the peer was removed from the configuration", down=False, status=None)
            return None
        sent = [(k, v) for k, v in headers if k.lower() not in _REPLACED]
        sent += [(k.encode(), v.encode()) for k, v in peer_headers(peer).items()]
        # The class it is served in here goes on: the peer orders it among its own waiting requests (and
        # clamps it to the class of the key this router presents there).
        sent.append((CLASS_HEADER.encode(), ticket.klass.label.encode()))
        sent.append((b"accept-encoding", b"identity"))  # relayed as it comes, so no encoding
        request = self.client.build_request(
            method,
            peer.url + target,
            headers=sent,
            content=_with_model(body, model),
            timeout=httpx.Timeout(self.read_timeout, connect=peer.connect_timeout),
        )
        try:
            response = await self.client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            ticket.peer_failed(describe_failure(exc), down=True, status=None)
            return None
        except httpx.HTTPError as exc:
            ticket.peer_failed(describe_failure(exc), down=False, status=None)
            return None
        if response.status_code >= 500 and response.status_code != LOOP_DETECTED:
            reply = PeerResponse(response, self.read_timeout)
            try:
                text, _ = await reply.read(BODY_LIMIT)
            finally:
                with trio.CancelScope(shield=True):
                    await reply.aclose()
            reason = f"it answered {response.status_code}: {_error_text(text)}"
            ticket.peer_failed(reason, down=False, status=response.status_code)
            return None
        ticket.observed.status = response.status_code
        return PeerResponse(response, self.read_timeout)


def _with_model(body: bytes, model: str) -> bytes:
    """The body naming ``model`` as the peer knows it (a pool or an alias here may be no name there)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body
    if not isinstance(doc, dict) or doc.get("model") == model:
        return body
    doc["model"] = model
    return json.dumps(doc).encode()


def _error_text(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else its first 200 characters."""
    try:
        doc = json.loads(body)
        message = doc["error"]["message"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return body[:200].decode("utf-8", "replace") or "no body"
