"""The owner of one request's life in the shell: what its HTTP handler waits on and reports to, the one
place that tells the scheduler how the request's life went on, and the record it leaves.

Handlers and the data path only report what they saw (``refused``, ``peer_failed``, ``end``); the ticket
decides what that means for the scheduler and tells it, through the owner task's channel, exactly once per
fact: a new wait after a refused connection (``DispatchFailed``, or ``RequestArrived`` again when the
replica had exited), a peer's failure (``PeerFailed``), and the end (``RequestFinished`` or
``ClientGone``, one of them, once). The owner task reports the scheduler's decisions to it (``sent``,
``rejected``). Its phases and the reports each phase takes are the table ``MOVES``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import trio

from router.journal.records import CLIENT_CLOSED, ERROR_TEXT_LIMIT, Observation, RequestRecord
from statemachine import (
    ClientGone,
    Dispatch,
    DispatchFailed,
    Event,
    Forward,
    PeerFailed,
    Reject,
    RejectCode,
    RequestArrived,
    RequestClass,
    RequestFinished,
)

REDISPATCHES = 2  # times a request whose replica refused it (or froze before answering) waits for another


class TicketPhase(enum.Enum):
    """Where the shell's side of a request stands. The scheduler's own view (queued, in flight) is in its
    state; this one says who still holds the ticket: the handler until it ends it, the scheduler until it
    rejects the request or steps the handler's report of its end."""

    WAITING = "waiting"  # admitted; the scheduler has not sent it to a replica (again)
    SENT = "sent"  # dispatched: ``dispatch`` and ``port`` name its replica or peer
    REJECTED = "rejected"  # the scheduler ended it with ``rejection`` and let go of it
    FINISHED = "finished"  # the handler ended it; the scheduler lets go once it has stepped the report


# Each report a ticket takes and the phases it takes it in; anything else is a fault of the shell.
MOVES: Mapping[str, frozenset[TicketPhase]] = {
    # The scheduler may dispatch a request whose handler ended it a moment ago (the end is on its way).
    "sent": frozenset({TicketPhase.WAITING, TicketPhase.FINISHED}),
    "rejected": frozenset({TicketPhase.WAITING, TicketPhase.SENT, TicketPhase.FINISHED}),
    "refused": frozenset({TicketPhase.SENT, TicketPhase.REJECTED}),
    "peer_failed": frozenset({TicketPhase.SENT}),
    "end": frozenset(TicketPhase),
}


class LifeOwner(Protocol):
    """What a ticket needs of the owner task: its event channel, and the bookkeeping of an ended request
    (its record for the history and the metrics; dropping the ticket once nobody holds it)."""

    def submit(self, event: Event) -> None: ...

    def ended(self, ticket: Ticket, completed: bool) -> None: ...

    def forget(self, rid: int) -> None: ...


class ShellFault(RuntimeError):
    """A report the ticket cannot take in its phase: the shell broke its own rules."""


@attrs.define(eq=False)
class Ticket:
    """One request's life in the shell (see the module's doc): what the handler waits on (``decided``) and
    reads, and the one place that tells the scheduler what became of the request."""

    rid: int
    target: str
    asked: str | None
    endpoint: str
    client: str
    started: float
    owner: LifeOwner | None = None  # None: a ticket outside a router (it tells nobody)
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
    key: str = ""  # the name of its client's key ("": anonymous or a plain api_keys key)
    klass: RequestClass = RequestClass.STANDARD  # its priority class, as the scheduler was told
    outside: frozenset[str] = frozenset()  # pool members its key may not use, as the scheduler was told
    keep_alive: float | None = None  # the idle time it asks for its model, as the scheduler was told
    refusals: int = 0  # connections its replicas refused so far

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

    @property
    def ended(self) -> bool:
        return self.phase is TicketPhase.FINISHED

    def _move(self, report: str) -> None:
        if self.phase not in MOVES[report]:
            raise ShellFault(f"request {self.rid}: '{report}' reported while {self.phase.value}")

    def _tell(self, event: Event) -> None:
        if self.owner is not None:
            self.owner.submit(event)

    def arrive(self) -> None:
        """Tell the scheduler the request arrived (once, as the router admits it)."""
        self._tell(
            RequestArrived(
                self.rid,
                self.target,
                self.tokens,
                self.prefix,
                self.local_only,
                self.key,
                self.klass,
                self.outside,
                self.keep_alive,
            )
        )

    # ----------------------------------------------------------------- the owner task's reports
    def sent(self, dispatch: Dispatch | Forward, port: int | None) -> None:
        """The scheduler sent it to a replica (``port``) or a peer."""
        self._move("sent")
        if self.phase is TicketPhase.FINISHED:
            return  # nobody waits: the handler's end, already on the owner's channel, frees the slot
        self.dispatch, self.port = dispatch, port
        self.dispatched_at = time.monotonic()
        self.phase = TicketPhase.SENT
        self.decided.set()

    def rejected(self, reject: Reject) -> None:
        """The scheduler ended the request."""
        self._move("rejected")
        self.rejection = reject
        if self.phase is TicketPhase.FINISHED:
            if self.owner is not None:
                self.owner.forget(self.rid)  # the handler was done already: nothing holds it now
            return
        self.phase = TicketPhase.REJECTED
        self.decided.set()

    # ----------------------------------------------------------------------- the handler's reports
    def refused(self, reason: str, *, again: bool = False) -> bool:
        """Its replica refused the connection (nothing reached it), or stopped answering before any byte of
        its reply (``reason`` says which). True: it waits for another decision
        (await ``decided`` again); False: it may not, and the handler answers with what it has. ``again``:
        the scheduler answered the last refusal with the replica's exit (it saw the exit first), which does
        not count as one more refusal."""
        self._move("refused")
        exited = self.rejection is not None and self.rejection.code is RejectCode.REPLICA_EXITED
        if not (self.rejection is None or exited) or (self.refusals >= REDISPATCHES and not again):
            return False
        self.refusals += 0 if again else 1
        self._again()
        if exited:
            # The scheduler saw the replica's exit first and ended the request; nothing reached a replica,
            # so it is admitted again, behind the requests waiting now, instead of failing.
            self.arrive()
        else:
            self._tell(DispatchFailed(self.rid, reason))
        return True

    def peer_failed(self, reason: str, *, down: bool, status: int | None) -> None:
        """The peer it was forwarded to failed it before any byte reached the client: the scheduler decides
        again (a pool's next member, or the answer)."""
        self._move("peer_failed")
        self._again()
        self._tell(PeerFailed(self.rid, reason, down, status))

    def end(self, *, completed: bool, broken: str = "") -> None:
        """The handler is done: ``completed`` when the answer went out whole (or the replica ended it),
        False when the client went away first. The one place that tells the scheduler a request ended, once:
        a client gone from a request in flight is told only now, after the handler closed its upstream
        exchange, so the slot goes to the next request at once. ``broken``: why the replica broke off the
        reply (the scheduler then sends it no new work). A second report changes nothing."""
        was = self.phase
        if was is TicketPhase.FINISHED:
            return
        self.phase = TicketPhase.FINISHED
        if self.owner is None:
            return
        self.owner.ended(self, completed)
        if was is TicketPhase.REJECTED:
            self.owner.forget(self.rid)
        elif was is TicketPhase.SENT and completed:
            self._tell(RequestFinished(self.rid, broken))
        else:
            self._tell(ClientGone(self.rid))

    def _again(self) -> None:
        self.rejection = None
        self.dispatch = self.port = None
        self.phase = TicketPhase.WAITING
        self.decided = trio.Event()


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
    if ticket.rejection is not None:  # its handler recorded the status it answered with (router.http.errors)
        error = ticket.rejection.message
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
        key=ticket.key,
    )
