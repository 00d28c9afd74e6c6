"""The shell's side of one request: what its HTTP handler waits on, and the record it leaves."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from router.journal.records import CLIENT_CLOSED, ERROR_TEXT_LIMIT, Observation, RequestRecord
from statemachine import Dispatch, Forward, Reject


class TicketPhase(enum.Enum):
    """Where the shell's side of a request stands. The scheduler's own view (queued, in flight) is in its
    state; this one says who still holds the ticket: the handler until it finishes, the scheduler until it
    rejects the request or steps the handler's last report about it."""

    WAITING = "waiting"  # admitted; the scheduler has not sent it to a replica (again)
    SENT = "sent"  # dispatched: ``dispatch`` and ``port`` name its replica
    REJECTED = "rejected"  # the scheduler ended it with ``rejection`` and let go of it
    FINISHED = (
        "finished"  # the handler is done; the scheduler lets go once it has stepped the handler's report
    )


@attrs.define(eq=False)
class Ticket:
    """The shell's side of one request: what the HTTP handler waits on (``decided``) and reads."""

    rid: int
    target: str
    asked: str | None
    endpoint: str
    client: str
    started: float
    phase: TicketPhase = TicketPhase.WAITING
    decided: trio.Event = attrs.field(factory=trio.Event)
    dispatch: Dispatch | Forward | None = None  # where the scheduler sent it: a replica, or a peer
    port: int | None = None
    rejection: Reject | None = None
    queued_at: float = attrs.field(factory=time.monotonic)
    dispatched_at: float | None = None
    observed: Observation = attrs.field(factory=Observation)
    body: Mapping[str, Any] | None = None  # the parsed JSON body (read when the request loads a model)
    tokens: int | None = None  # what it needs in one slot, as the scheduler was told
    prefix: tuple[int, ...] = ()  # its prefix chain, as the scheduler was told
    local_only: bool = False  # it came through another router: no peer may serve it

    @property
    def model(self) -> str | None:
        return None if self.dispatch is None else self.dispatch.model

    @property
    def reject(self) -> Reject | None:
        """The rejection to answer with instead of forwarding: one that came before a replica took it."""
        return self.rejection if self.dispatch is None else None

    @property
    def peer(self) -> str | None:
        """The peer it was forwarded to, if the scheduler sent it to one."""
        return self.dispatch.peer if isinstance(self.dispatch, Forward) else None

    def sent(self, dispatch: Dispatch | Forward, port: int | None) -> None:
        self.dispatch, self.port = dispatch, port
        self.dispatched_at = time.monotonic()
        self.phase = TicketPhase.SENT
        self.decided.set()

    def again(self) -> None:
        """Its replica refused the connection: it waits for another decision."""
        self.rejection = None
        self.dispatch = self.port = None
        self.phase = TicketPhase.WAITING
        self.decided = trio.Event()

    def rejected(self, reject: Reject) -> bool:
        """The scheduler ended the request. True when the handler was done already: nothing holds it now."""
        self.rejection = reject
        if self.phase is TicketPhase.FINISHED:
            return True
        self.phase = TicketPhase.REJECTED
        self.decided.set()
        return False


def record_of(ticket: Ticket, *, completed: bool, now: float | None = None) -> RequestRecord:
    """The record of an admitted request whose handler has just finished (``now``: time.monotonic())."""
    now = time.monotonic() if now is None else now
    observed = ticket.observed
    status = observed.status
    error = observed.error
    sniffer = observed.sniffer
    if sniffer is not None:
        sniffer.close()
        if sniffer.error is not None:
            code, text = sniffer.error
            error = error or text
            if code is not None and code >= 400 and (status is None or status < 400):
                status = code
    if ticket.rejection is not None:
        status, error = ticket.rejection.status, ticket.rejection.message
    if not completed and (status is None or status < 400):
        status, error = CLIENT_CLOSED, "the client closed the connection before the reply ended"
    if status is None:
        status = 200
    usage = sniffer.usage if sniffer is not None else None
    first = sniffer.first_content_at if sniffer is not None else None
    dispatched = ticket.dispatched_at
    return RequestRecord(
        at=ticket.started,
        client=ticket.client,
        endpoint=ticket.endpoint,
        model_asked=ticket.asked,
        model_served=ticket.model,
        status=status,
        duration=max(0.0, now - ticket.queued_at),
        queue_wait=None if dispatched is None else max(0.0, dispatched - ticket.queued_at),
        ttft=None if first is None else max(0.0, first - ticket.queued_at),
        prompt_tokens=None if usage is None else usage.prompt_tokens,
        generated_tokens=None if usage is None else usage.generated_tokens,
        cached_tokens=None if usage is None else usage.cached_tokens,
        error=None if error is None else error[:ERROR_TEXT_LIMIT],
        target=ticket.target,
        stream=observed.stream,
    )
