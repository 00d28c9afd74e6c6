"""What the router keeps of loads, readiness, stops, exits, failures and saved prompt caches: the recent
ones for /status and the dashboard, each logged once and handed to the listeners (the metrics).

Each kind of happening has one name from the owner task to /status, the metrics and the dashboard
(``HappeningKind``); a string compares equal to its member, so readers of the JSON see the same words.
"""

from __future__ import annotations

import collections
import enum
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from router.shell.kv_slots import KvOutcome, KvResult
from statemachine import KillCause

log = logging.getLogger("router")

RECENT = 200  # happenings kept for /status


class HappeningKind(enum.StrEnum):
    LOAD = "load"  # a replica's process was started
    READY = "ready"  # it answered /health
    LOAD_FAILED = "load_failed"  # its process ended (or gave up) before it was ready
    LOAD_REFUSED = "load_refused"  # no process was started: other programs took the memory planned for it
    UNRESPONSIVE = "unresponsive"  # a ready replica stopped answering its health probes
    STOP = "stop"  # the router told it to stop (``cause`` says why)
    EXITED = "exited"  # its process ended after it was ready, or when told to stop
    KV_SAVE = "kv_save"  # its slots were saved before it stopped (``kv``)
    KV_RESTORE = "kv_restore"  # a saved state was restored into it (``kv``)


# Kinds that mean something went wrong, logged as warnings.
WARNINGS = frozenset({HappeningKind.LOAD_FAILED, HappeningKind.LOAD_REFUSED, HappeningKind.UNRESPONSIVE})


@attrs.frozen
class Happening:
    """A load, eviction or failure, kept for /status and the dashboard. ``reason`` is for people to read;
    programs read ``cause``, the scheduler's ``KillCause`` of a ``stop``, and ``asked``, on an ``exited`` or
    ``load_failed`` that reports a process's end, whether the router stopped it (None where they do not
    apply)."""

    at: float
    kind: HappeningKind
    model: str
    replica: int
    reason: str
    cause: KillCause | None = None
    asked: bool | None = None
    kv: KvOutcome | None = None  # a ``kv_save`` or ``kv_restore``: what it did


Listener = Callable[[str, dict[str, Any]], None]


class Happenings:
    """The recent happenings, newest last, and the listeners each new one is handed to."""

    def __init__(self) -> None:
        self._recent: collections.deque[Happening] = collections.deque(maxlen=RECENT)
        self.listeners: list[Listener] = []

    def __iter__(self) -> Iterator[Happening]:
        return iter(self._recent)

    def __reversed__(self) -> Iterator[Happening]:
        return reversed(self._recent)

    def __len__(self) -> int:
        return len(self._recent)

    def note(
        self,
        kind: HappeningKind,
        model: str,
        replica: int,
        reason: str,
        cause: KillCause | None = None,
        *,
        asked: bool | None = None,
        kv: KvOutcome | None = None,
    ) -> Happening:
        happening = Happening(time.time(), kind, model, replica, reason, cause, asked, kv)
        self._recent.append(happening)
        failed = kv is not None and kv.outcome in (KvResult.FAILED, KvResult.TIMEOUT)
        level = logging.WARNING if kind in WARNINGS or failed else logging.INFO
        log.log(level, "%s %s (replica %d): %s", kind, model, replica, reason)
        for listener in self.listeners:
            try:
                listener(kind, attrs.asdict(happening))
            except Exception:  # the metrics' faults stay theirs; the owner task must go on
                log.exception("a happening listener failed")
        return happening
