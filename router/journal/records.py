"""One finished request as the history and the metrics see it, and how a request's record is built.

Every request the router admits carries an :class:`Observation` on its ticket; the proxy notes on it the
status the upstream answered and hands it the relayed chunks (through a ``UsageSniffer``). When the
handler is done with the ticket, ``router.shell.ticket.record_of`` turns both into a :class:`RequestRecord`.

Statuses: the HTTP status the client got, except that a request rejected after its event stream began
(status 200 with keep-alive comments) records the rejection's status, a stream broken off by a failing
replica records 502, and a client that went away before the reply ended records 499.

Every text field of a record is made valid Unicode as the record is built (``valid_text``): records feed
SQLite and the metrics, whose encoders refuse lone surrogates. Client bodies holding one are refused where
they are parsed (``router.http.request_body``), but a replica's reply can still spell one in an error message.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from router.journal.usage import UsageSniffer

CLIENT_CLOSED = 499
ERROR_TEXT_LIMIT = 500

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so that it encodes as UTF-8."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def _valid_or_none(text: str | None) -> str | None:
    return None if text is None else valid_text(text)


@attrs.frozen
class RequestRecord:
    """One request, as kept in the history. Times are seconds; ``at`` is the wall-clock arrival time.

    ``model_asked`` is the name in the request (None when it named none); ``model_served`` the model whose
    replica answered (None when none did). ``queue_wait`` runs from arrival to dispatch, ``ttft`` from
    arrival to the first generated content of a stream (None for plain replies), ``duration`` from
    arrival to the end of the reply.
    """

    at: float
    client: str = attrs.field(converter=valid_text)
    endpoint: str = attrs.field(converter=valid_text)
    model_asked: str | None = attrs.field(converter=_valid_or_none)
    model_served: str | None = attrs.field(converter=_valid_or_none)
    status: int
    duration: float
    queue_wait: float | None = None
    ttft: float | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = attrs.field(default=None, converter=_valid_or_none)
    target: str | None = attrs.field(default=None, converter=_valid_or_none)
    stream: bool = False
    key: str = attrs.field(default="", converter=valid_text)  # its client's key name ("": anonymous)

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @property
    def metric_model(self) -> str:
        """A model label of bounded variety: the served model, else the resolved target, else empty."""
        return self.model_served or self.target or ""


@attrs.define(eq=False)
class Observation:
    """What the proxy learned about one request while serving it."""

    stream: bool = False
    status: int | None = None
    error: str | None = None
    sniffer: UsageSniffer | None = None

    def sniff(self, *, sse: bool) -> UsageSniffer:
        self.sniffer = UsageSniffer(sse=sse)
        return self.sniffer

    def fail(self, status: int, message: str) -> None:
        self.status = status
        if self.error is None:
            self.error = message[:ERROR_TEXT_LIMIT]
