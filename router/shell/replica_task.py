"""One replica's life inside the supervisor: start the process, keep its output, watch /health, stop it.

A :class:`ReplicaTask` is created by ``Supervisor.spawn`` and run in the supervisor's nursery. It reports
through the supervisor's callback (see ``router.shell.processes``): ``ReplicaReady`` once /health answers
200, ``LoadFailed`` when it does not within the load timeout, ``ReplicaUnresponsive`` when a ready replica
goes silent for ``hang_timeout``, and always, last, ``ReplicaExited`` once the process is reaped.

Where the task stands is one :class:`ProcessPhase`; what may happen in each phase, and the phase it leads
to, is the table ``MOVES`` (keyed by the phase and what :class:`Happened`, as h11's ``_state.py`` keeps its
tables). Anything the table lacks is a fault of the task (:class:`ReplicaTaskFault`), except a stop: the
supervisor may ask at any time, and a phase that takes no stop (already stopping, or gone) ignores it. What
the exit report needs of the past — did the replica ever serve, did we SIGKILL it — is read off the phases
it went through (``path``).
"""

from __future__ import annotations

import enum
import logging
import signal
import subprocess
import time
from collections import deque
from collections.abc import Mapping

import attrs
import httpx
import trio

from router.shell.child import Child, describe_os_error, describe_returncode, launch
from router.shell.kv_slots import restore_into, restore_others, save_slots
from router.shell.logring import LineSplitter, quote_lines
from router.shell.processes import LaunchSpec, ReplicaKv, ReplicaProcessInfo, Report, SupervisorEvent
from router.shell.replica_logs import ReplicaLogFile, ReplicaLogs
from statemachine.events import LoadFailed, ReplicaExited, ReplicaReady, ReplicaUnresponsive

__all__ = ["MOVES", "Happened", "ProcessPhase", "ReplicaTask", "ReplicaTaskFault", "next_phase"]

_HEALTH_INTERVAL = 0.1  # seconds between /health probes while loading
_HEALTH_FIRST = 0.01  # the first probes come faster: small models are ready in well under a second
_HEALTH_CALL_TIMEOUT = 1.0  # seconds one /health probe may take
_WATCH_EVERY = 0.5  # seconds between /health probes of a ready replica (at most)
_SHUTDOWN_GRACE = 3.0  # most seconds between SIGTERM and SIGKILL when the supervisor itself is cancelled
_KILL_WAIT = 10.0  # seconds to wait for a SIGKILLed child during shutdown before giving up on it
_DRAIN_WAIT = 2.0  # seconds to wait for the output pipe to reach EOF after the child is reaped
_READ_CHUNK = 65536
# Once the replica is ready, after a read that emptied the pipe the pump waits this long before reading again
# (or until the process exits, whose last lines the exit report waits for), so that the dozen lines
# llama-server prints around each request are taken in one read and one file write, not one by one while
# the request runs (the pipe holds far more than a replica prints in this time). While it loads, every line
# is read at once: what it prints then (its buffers, its context, why it failed) is read as it is printed.
_OUTPUT_BATCH = 0.05
# Exit statuses a stop of ours accounts for: a clean exit, or SIGTERM's death (direct, or through a shell
# that ran the process, 128 + the signal). SIGKILL's counts only once we sent it.
_STOPPED_BY_SIGTERM = frozenset({0, -signal.SIGTERM, 128 + signal.SIGTERM})
_STOPPED_BY_SIGKILL = frozenset({-signal.SIGKILL, 128 + signal.SIGKILL})


class ProcessPhase(enum.Enum):
    """Where a replica's process stands, as its task sees it."""

    PENDING = "pending"  # spawned; the process is not started yet
    LOADING = "loading"  # started; /health has not answered 200 yet
    READY = "ready"  # serving; a watched /health
    SAVING = "saving"  # asked to stop with its slots saved first: saving them, SIGTERM next
    STOPPING = "stopping"  # asked to stop (or given up on): SIGTERM, SIGKILL after stop_timeout
    KILLING = "killing"  # we sent SIGKILL
    EXITED = "exited"  # the process is reaped (or never started, or let go of); its exit is reported next
    RETIRED = "retired"  # the exit is reported and the supervisor keeps the task only for its logs


class Happened(enum.Enum):
    """What can happen to a replica's task: the second key of ``MOVES``."""

    LAUNCHED = "launched"  # the process started
    HEALTHY = "healthy"  # /health answered 200 (and the saved state suited to the load is restored)
    LOAD_FAILED = "load failed"  # /health did not answer 200 within load_timeout
    UNRESPONSIVE = "unresponsive"  # a ready replica answered nothing for hang_timeout: SIGKILLed at once
    ASKED_TO_STOP = "asked to stop"  # Supervisor.kill
    ASKED_TO_SAVE = "asked to save and stop"  # Supervisor.kill(save=True) of a replica started with kv
    SAVED = "saved"  # its slots are saved (or the save failed): SIGTERM now
    KILLED = "killed"  # we sent SIGKILL: stop_timeout after SIGTERM, or as the supervisor shuts down
    SHUTDOWN = "shutdown"  # the supervisor was cancelled while the process ran: stop it before letting go
    EXITED = "exited"  # the process is gone (or could not start, or was stopped before it started)
    RETIRED = "retired"  # the supervisor moved the task to its exited replicas


_P, _H = ProcessPhase, Happened
MOVES: Mapping[tuple[ProcessPhase, Happened], ProcessPhase] = {
    (_P.PENDING, _H.LAUNCHED): _P.LOADING,
    (_P.PENDING, _H.ASKED_TO_STOP): _P.STOPPING,  # it will never start
    (_P.PENDING, _H.ASKED_TO_SAVE): _P.STOPPING,  # nothing to save
    (_P.PENDING, _H.EXITED): _P.EXITED,  # it could not start
    (_P.LOADING, _H.HEALTHY): _P.READY,
    (_P.LOADING, _H.LOAD_FAILED): _P.STOPPING,
    (_P.LOADING, _H.ASKED_TO_STOP): _P.STOPPING,
    (_P.LOADING, _H.ASKED_TO_SAVE): _P.STOPPING,  # it served nothing: nothing to save
    (_P.LOADING, _H.SHUTDOWN): _P.STOPPING,
    (_P.LOADING, _H.EXITED): _P.EXITED,
    (_P.READY, _H.UNRESPONSIVE): _P.STOPPING,
    (_P.READY, _H.ASKED_TO_STOP): _P.STOPPING,
    (_P.READY, _H.ASKED_TO_SAVE): _P.SAVING,
    (_P.READY, _H.SHUTDOWN): _P.STOPPING,
    (_P.READY, _H.EXITED): _P.EXITED,
    (_P.SAVING, _H.SAVED): _P.STOPPING,
    (_P.SAVING, _H.SHUTDOWN): _P.STOPPING,  # the save is cut short
    (_P.SAVING, _H.EXITED): _P.EXITED,
    (_P.STOPPING, _H.KILLED): _P.KILLING,
    (_P.STOPPING, _H.SHUTDOWN): _P.STOPPING,
    (_P.STOPPING, _H.EXITED): _P.EXITED,
    (_P.KILLING, _H.KILLED): _P.KILLING,  # the supervisor's shutdown kills it again
    (_P.KILLING, _H.SHUTDOWN): _P.KILLING,
    (_P.KILLING, _H.EXITED): _P.EXITED,
    (_P.EXITED, _H.RETIRED): _P.RETIRED,
}
del _P, _H


class ReplicaTaskFault(RuntimeError):
    """Something happened that the task's phase does not take: the task broke its own rules."""


def next_phase(phase: ProcessPhase, happened: Happened) -> ProcessPhase:
    """The phase ``happened`` leads to from ``phase``; ReplicaTaskFault when the table has no such move."""
    try:
        return MOVES[phase, happened]
    except KeyError:
        raise ReplicaTaskFault(
            f"'{happened.value}' cannot happen to a replica task that is {phase.value}"
        ) from None


@attrs.define(eq=False)
class ReplicaTask:
    """One replica: its launch spec, its last output lines, its process and its phase (see the module doc)."""

    spec: LaunchSpec
    log: deque[str]
    report: Report
    logger: logging.Logger
    log_files: ReplicaLogs | None = None
    file: ReplicaLogFile | None = None
    done: trio.Event = attrs.field(factory=trio.Event)  # set once the supervisor has retired the task
    stop_requested: trio.Event = attrs.field(factory=trio.Event)  # wakes the stopper (SIGTERM, SIGKILL)
    child: Child | None = None
    started_at: float | None = None
    started_clock: float = 0.0
    phase: ProcessPhase = ProcessPhase.PENDING
    path: list[ProcessPhase] = attrs.field(factory=lambda: [ProcessPhase.PENDING])  # every phase so far
    returncode: int | None = None
    stop_reason: str | None = None
    unresponsive: bool = False  # killed for leaving /health unanswered for hang_timeout

    @property
    def label(self) -> str:
        return f"{self.spec.model}#{self.spec.replica_id}"

    @property
    def ever_ready(self) -> bool:
        """Whether /health ever answered 200 (it stays so once the replica is stopped or gone)."""
        return ProcessPhase.READY in self.path

    @property
    def sigkilled(self) -> bool:
        """Whether we sent SIGKILL as part of a stop (the kill of a hung replica is not one)."""
        return ProcessPhase.KILLING in self.path

    def _move(self, happened: Happened) -> None:
        """Take one step of the table; an illegal one raises and leaves the phase as it was."""
        phase = next_phase(self.phase, happened)
        if phase is not self.phase:
            self.phase = phase
            self.path.append(phase)

    def _begin_stop(self, happened: Happened, reason: str) -> None:
        self._move(happened)
        self.stop_reason = reason
        self.stop_requested.set()

    def snapshot(self) -> ReplicaProcessInfo:
        return ReplicaProcessInfo(
            replica_id=self.spec.replica_id,
            model=self.spec.model,
            pid=self.child.pid if self.child is not None else None,
            port=self.spec.port,
            argv=self.spec.argv,
            started_at=self.started_at,
            ready=self.ever_ready,
            exited=self.phase is ProcessPhase.RETIRED,
            returncode=self.returncode,
            stop_reason=self.stop_reason,
            log_path=str(self.file.path) if self.file is not None else None,
            unresponsive=self.unresponsive,
        )

    def stop(self, reason: str, *, save: bool = False) -> None:
        """Ask the task to stop the process: SIGTERM at once (after saving its slots, for ``save``), SIGKILL
        after stop_timeout. The first reason stays; a replica whose process has exited is left alone."""
        happened = Happened.ASKED_TO_SAVE if save and self.spec.kv is not None else Happened.ASKED_TO_STOP
        if (self.phase, happened) not in MOVES:  # already stopping, or gone
            return
        self._begin_stop(happened, reason)

    def retire(self) -> None:
        """The supervisor moved the task to its exited replicas (its exit is reported)."""
        self._move(Happened.RETIRED)

    # ---- the task ----------------------------------------------------------------------------------

    async def run(self, http: httpx.AsyncHTTPTransport) -> None:
        """Start the process and see it through to its reaping; reports ``ReplicaExited`` last."""
        spec = self.spec
        if self.phase is not ProcessPhase.PENDING:  # stopped before it started
            self._move(Happened.EXITED)
            self._finish(None, f"stopped: {self.stop_reason}")
            return
        try:
            child = launch(spec)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = (
                f"could not start llama-server for {spec.model!r}: {spec.argv[0]}: {describe_os_error(exc)}"
            )
            self._move(Happened.EXITED)
            self._finish(None, reason)
            return
        self.child = child
        self._move(Happened.LAUNCHED)
        self.started_at = time.time()
        self.started_clock = trio.current_time()
        if self.file is not None:
            self.file.note(f"started pid {child.pid} on port {spec.port}")
        self.logger.info(
            "[%s] started pid %d on port %d: %s", self.label, child.pid, spec.port, " ".join(spec.argv)
        )
        try:
            async with trio.open_nursery() as outer:
                drained, exited = trio.Event(), trio.Event()
                outer.start_soon(self._pump_output, child.output, drained, exited)
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(self._probe_health, http)
                    watchers.start_soon(self._stop_when_asked, child, http)
                    await child.wait_exited()
                    # Reaped at once, in the step that saw the exit: no cancellation comes in between.
                    self.returncode = child.reap()
                    self._move(Happened.EXITED)
                    watchers.cancel_scope.cancel()
                exited.set()  # the pump reads the rest now, not after its pause
                with trio.move_on_after(_DRAIN_WAIT):
                    await drained.wait()
                outer.cancel_scope.cancel()
        finally:
            if self.phase is not ProcessPhase.EXITED:
                # Cancelled (or failed) while the child still runs: stop it before letting go.
                with trio.CancelScope(shield=True):
                    if self.stop_reason is None:
                        self.stop_reason = "supervisor shutting down"
                    self._move(Happened.SHUTDOWN)
                    self.returncode = await self._terminate(child)
                    self._move(Happened.EXITED)
            child.close()
            self._finish(self.returncode, self._exit_reason())

    async def _terminate(self, child: Child) -> int | None:
        """SIGTERM, a short grace period, SIGKILL, reap. Used when the supervisor itself is cancelled."""
        child.signal_group(signal.SIGTERM)
        with trio.move_on_after(min(self.spec.stop_timeout, _SHUTDOWN_GRACE)):
            await child.wait_exited()
        self._move(Happened.KILLED)
        child.signal_group(signal.SIGKILL)
        with trio.move_on_after(_KILL_WAIT):
            await child.wait_exited()
        returncode = child.reap()
        if returncode is None:
            self.logger.error(
                "[%s] pid %d survived SIGKILL for %g s; giving up on it", self.label, child.pid, _KILL_WAIT
            )
        return returncode

    async def _stop_when_asked(self, child: Child, http: httpx.AsyncHTTPTransport) -> None:
        await self.stop_requested.wait()
        kv = self.spec.kv
        if self.phase is ProcessPhase.SAVING and kv is not None:
            spec = self.spec
            result = await save_slots(http, spec.port, kv.store, kv.shelf, spec.replica_id, kv.timeout)
            self._emit(ReplicaKv(self.spec.replica_id, result))
            if self.phase is not ProcessPhase.SAVING:
                return  # it exited while saving, seen in the same step as the save's end: nothing to stop
            self._move(Happened.SAVED)
        self.logger.info("[%s] stopping pid %d: %s", self.label, child.pid, self.stop_reason)
        child.signal_group(signal.SIGTERM)
        await trio.sleep(self.spec.stop_timeout)
        if self.phase is ProcessPhase.EXITED:
            return  # it exited in the same step as the timer ran out
        self.logger.warning(
            "[%s] pid %d still running %g s after SIGTERM; sending SIGKILL",
            self.label,
            child.pid,
            self.spec.stop_timeout,
        )
        self._move(Happened.KILLED)
        child.signal_group(signal.SIGKILL)

    # ---- output ------------------------------------------------------------------------------------

    async def _pump_output(
        self, stream: trio.lowlevel.FdStream, drained: trio.Event, exited: trio.Event
    ) -> None:
        splitter = LineSplitter()
        try:
            while True:
                try:
                    data = await stream.receive_some(_READ_CHUNK)
                except (trio.ClosedResourceError, OSError):
                    break
                if not data:
                    break
                self._take_lines(splitter.feed(data))
                if len(data) < _READ_CHUNK and self.ever_ready and not exited.is_set():
                    with trio.move_on_after(_OUTPUT_BATCH):
                        await exited.wait()
            self._take_lines(splitter.flush())
        finally:
            drained.set()

    def _take_lines(self, lines: list[str]) -> None:
        """Output lines read together: into the ring buffer, the replica's file (one write) and the router's
        DEBUG log."""
        self.log.extend(lines)
        if self.file is not None:
            self.file.write_lines(lines)
        if self.logger.isEnabledFor(logging.DEBUG):
            for line in lines:
                self.logger.debug("[%s] %s", self.label, line)

    # ---- health ------------------------------------------------------------------------------------

    async def _probe_health(self, http: httpx.AsyncHTTPTransport) -> None:
        spec = self.spec
        url = f"http://127.0.0.1:{spec.port}/health"
        deadline = self.started_clock + spec.load_timeout
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            try:
                status = await _get_status(http, url, min(_HEALTH_CALL_TIMEOUT, remaining))
            except httpx.HTTPError:
                pass
            else:
                if status == 200:
                    restored = await self._restore(http)
                    if self.phase is ProcessPhase.LOADING:
                        self._move(Happened.HEALTHY)
                        self.logger.info(
                            "[%s] ready after %.1f s", self.label, trio.current_time() - self.started_clock
                        )
                        self._emit(ReplicaReady(spec.replica_id))
                        await self._restore_others(http, restored)
                        await self._watch_ready(http, url)
                    return
            remaining = deadline - trio.current_time()
            since = trio.current_time() - self.started_clock
            interval = min(_HEALTH_INTERVAL, max(_HEALTH_FIRST, since / 10))
            await trio.sleep(max(0.0, min(interval, remaining)))
        if self.phase is not ProcessPhase.LOADING:
            return
        reason = (
            f"llama-server for {spec.model!r} did not answer /health within {spec.load_timeout:g} s; "
            f"log: {quote_lines(self.log)}"
        )
        self.logger.error("[%s] %s", self.label, reason)
        self._emit(LoadFailed(spec.replica_id, reason))
        if self.phase is ProcessPhase.LOADING:  # the report's reader may have stopped it already
            self._begin_stop(Happened.LOAD_FAILED, reason)

    async def _restore(self, http: httpx.AsyncHTTPTransport) -> str | None:
        """Before the replica takes requests: restore the saved state that suits the request loading it.
        Returns that state's name (None: nothing restored)."""
        kv = self.spec.kv
        if kv is None or self.phase is not ProcessPhase.LOADING:
            return None
        result = await restore_into(http, self.spec.port, kv.store, kv.shelf, kv.probe, kv.timeout)
        if result.outcome != "empty":
            self._emit(ReplicaKv(self.spec.replica_id, result))
        return result.detail if result.outcome == "restored" else None

    async def _restore_others(self, http: httpx.AsyncHTTPTransport, restored: str | None) -> None:
        """Once the replica serves: its other slots get the next most recently used states."""
        kv = self.spec.kv
        if kv is None or self.phase is not ProcessPhase.READY:
            return
        for result in await restore_others(http, self.spec.port, kv.store, kv.shelf, restored, kv.timeout):
            self._emit(ReplicaKv(self.spec.replica_id, result))

    async def _watch_ready(self, http: httpx.AsyncHTTPTransport, url: str) -> None:
        """Probe a ready replica's /health; one that answers nothing (any status counts as an answer) for
        ``hang_timeout`` seconds — stopped, deadlocked in a driver call — is killed at once and reported."""
        spec = self.spec
        if spec.hang_timeout is None:
            return
        every = max(0.05, min(_WATCH_EVERY, spec.hang_timeout / 4))
        last_answer = trio.current_time()
        while self.phase is ProcessPhase.READY:
            await trio.sleep(every)
            left = spec.hang_timeout - (trio.current_time() - last_answer)
            try:
                # A probe may take until the silence reaches hang_timeout: a late answer still counts.
                await _get_status(http, url, max(every, left))
            except httpx.HTTPError:
                silent = trio.current_time() - last_answer
                if silent < spec.hang_timeout or self.phase is not ProcessPhase.READY:
                    continue
                reason = f"no answer to /health for {silent:.0f} s (hang_timeout = {spec.hang_timeout:g})"
                self.logger.error("[%s] %s: killing it", self.label, reason)
                self.unresponsive = True
                self._begin_stop(Happened.UNRESPONSIVE, f"not responding: {reason}")
                if self.child is not None:
                    self.child.signal_group(signal.SIGKILL)  # a stopped or hung process ignores SIGTERM
                self._emit(ReplicaUnresponsive(spec.replica_id, reason))
                return
            else:
                last_answer = trio.current_time()

    # ---- the end -----------------------------------------------------------------------------------

    def _exit_reason(self) -> str:
        if self.stop_reason is not None and not self._died_by_itself():
            return f"stopped: {self.stop_reason}"
        when = "while loading" if not self.ever_ready else "after it was ready"
        how = describe_returncode(self.returncode)
        stopping = f", as it was being stopped ({self.stop_reason})" if self.stop_reason is not None else ""
        return (
            f"llama-server for {self.spec.model!r} exited with {how} {when}{stopping}; "
            f"log: {quote_lines(self.log, cause=not self.ever_ready)}"
        )

    def _died_by_itself(self) -> bool:
        """It was asked to stop, yet its exit status is not one the stop accounts for: it crashed on its own
        (a replica that broke off a reply is often stopped as it dies), and its own failure is the news."""
        code = self.returncode
        if code is None or code in _STOPPED_BY_SIGTERM:
            return False
        return not (self.sigkilled and code in _STOPPED_BY_SIGKILL)

    def _finish(self, returncode: int | None, reason: str) -> None:
        self.returncode = returncode
        if self.file is not None:
            self.file.note(f"exited ({describe_returncode(returncode)}): {reason}")
            if self.log_files is not None:
                self.log_files.closed(self.file)
        if self.stop_reason is not None:
            self.logger.info("[%s] exited (%s): %s", self.label, describe_returncode(returncode), reason)
        else:
            self.logger.warning("[%s] %s", self.label, reason)
        self._emit(ReplicaExited(self.spec.replica_id, reason))

    def _emit(self, event: SupervisorEvent) -> None:
        try:
            self.report(event)
        except Exception:
            self.logger.exception("report callback failed for %r", event)


async def _get_status(http: httpx.AsyncHTTPTransport, url: str, timeout: float) -> int:
    request = httpx.Request("GET", url, extensions={"timeout": httpx.Timeout(timeout).as_dict()})
    response = await http.handle_async_request(request)
    try:
        await response.aread()
    finally:
        await response.aclose()
    return response.status_code
