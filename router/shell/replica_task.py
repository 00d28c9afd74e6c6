"""One replica's life inside the supervisor: start the process, keep its output, watch /health, stop it.

A :class:`ReplicaTask` is created by ``Supervisor.spawn`` and run in the supervisor's nursery. It reports
through the supervisor's callback (see ``router.shell.processes``): ``ProcessReady`` once /health answers
200, ``ProcessLoadFailed`` when it does not within the load timeout, ``ProcessUnresponsive`` when a ready
replica goes silent for ``hang_timeout``, and always, last, ``ProcessExited`` once the process is reaped.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections import deque

import attrs
import httpx
import trio

from router.shell.child import Child, describe_os_error, describe_returncode, launch
from router.shell.kv_slots import restore_into, restore_others, save_slots
from router.shell.logring import LineSplitter, quote_lines
from router.shell.processes import (
    LaunchSpec,
    ProcessExited,
    ProcessKv,
    ProcessLoadFailed,
    ProcessReady,
    ProcessUnresponsive,
    ReplicaProcessInfo,
    Report,
    SupervisorEvent,
)
from router.shell.replica_logs import ReplicaLogFile, ReplicaLogs

__all__ = ["ReplicaTask"]

_HEALTH_INTERVAL = 0.1  # seconds between /health probes while loading
_HEALTH_FIRST = 0.01  # the first probes come faster: small models are ready in well under a second
_HEALTH_CALL_TIMEOUT = 1.0  # seconds one /health probe may take
_WATCH_EVERY = 5.0  # seconds between /health probes of a ready replica (at most)
_SHUTDOWN_GRACE = 3.0  # most seconds between SIGTERM and SIGKILL when the supervisor itself is cancelled
_KILL_WAIT = 10.0  # seconds to wait for a SIGKILLed child during shutdown before giving up on it
_DRAIN_WAIT = 2.0  # seconds to wait for the output pipe to reach EOF after the child is reaped
_READ_CHUNK = 65536
# Exit statuses a stop of ours accounts for: a clean exit, or SIGTERM's death (direct, or through a shell
# that ran the process, 128 + the signal). SIGKILL's counts only once we sent it.
_STOPPED_BY_SIGTERM = frozenset({0, -signal.SIGTERM, 128 + signal.SIGTERM})
_STOPPED_BY_SIGKILL = frozenset({-signal.SIGKILL, 128 + signal.SIGKILL})


@attrs.define(eq=False)
class ReplicaTask:
    """One replica: its launch spec, its last output lines, its process and how far it got."""

    spec: LaunchSpec
    log: deque[str]
    report: Report
    logger: logging.Logger
    log_files: ReplicaLogs | None = None
    file: ReplicaLogFile | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    stop_requested: trio.Event = attrs.field(factory=trio.Event)
    child: Child | None = None
    started_at: float | None = None
    started_clock: float = 0.0
    ready: bool = False
    exit_seen: bool = False
    finished: bool = False
    returncode: int | None = None
    stop_reason: str | None = None
    save_first: bool = False
    sent_sigkill: bool = False

    @property
    def label(self) -> str:
        return f"{self.spec.model}#{self.spec.replica_id}"

    def snapshot(self) -> ReplicaProcessInfo:
        return ReplicaProcessInfo(
            replica_id=self.spec.replica_id,
            model=self.spec.model,
            pid=self.child.pid if self.child is not None else None,
            port=self.spec.port,
            argv=self.spec.argv,
            started_at=self.started_at,
            ready=self.ready,
            exited=self.finished,
            returncode=self.returncode,
            stop_reason=self.stop_reason,
            log_path=str(self.file.path) if self.file is not None else None,
        )

    def stop(self, reason: str, *, save: bool = False) -> None:
        """Ask the task to stop the process: SIGTERM at once (after saving its slots, for ``save``), SIGKILL
        after stop_timeout. The first reason stays; a replica whose process has exited is left alone."""
        if self.exit_seen or self.stop_reason is not None:
            return
        self.stop_reason = reason
        self.save_first = save
        self.stop_requested.set()

    # ---- the task ----------------------------------------------------------------------------------

    async def run(self, http: httpx.AsyncHTTPTransport) -> None:
        """Start the process and see it through to its reaping; reports ``ProcessExited`` last."""
        spec = self.spec
        if self.stop_reason is not None:
            self._finish(None, f"stopped: {self.stop_reason}")
            return
        try:
            child = launch(spec)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = (
                f"could not start llama-server for {spec.model!r}: {spec.argv[0]}: {describe_os_error(exc)}"
            )
            self._finish(None, reason)
            return
        self.child = child
        self.started_at = time.time()
        self.started_clock = trio.current_time()
        if self.file is not None:
            self.file.note(f"started pid {child.pid} on port {spec.port}")
        self.logger.info(
            "[%s] started pid %d on port %d: %s", self.label, child.pid, spec.port, " ".join(spec.argv)
        )
        try:
            async with trio.open_nursery() as outer:
                drained = trio.Event()
                outer.start_soon(self._pump_output, child.output, drained)
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(self._probe_health, http)
                    watchers.start_soon(self._stop_when_asked, child, http)
                    await child.wait_exited()
                    self.exit_seen = True
                    watchers.cancel_scope.cancel()
                self.returncode = child.reap()
                with trio.move_on_after(_DRAIN_WAIT):
                    await drained.wait()
                outer.cancel_scope.cancel()
        finally:
            if not child.reaped:
                # Cancelled (or failed) while the child still runs: stop it before letting go.
                with trio.CancelScope(shield=True):
                    if self.stop_reason is None:
                        self.stop_reason = "supervisor shutting down"
                    self.exit_seen = True
                    self.returncode = await self._terminate(child)
            child.close()
            self._finish(self.returncode, self._exit_reason())

    async def _terminate(self, child: Child) -> int | None:
        """SIGTERM, a short grace period, SIGKILL, reap. Used when the supervisor itself is cancelled."""
        child.signal_group(signal.SIGTERM)
        with trio.move_on_after(min(self.spec.stop_timeout, _SHUTDOWN_GRACE)):
            await child.wait_exited()
        self.sent_sigkill = True
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
        if self.save_first and self.ready and kv is not None:
            spec = self.spec
            result = await save_slots(http, spec.port, kv.store, kv.shelf, spec.replica_id, kv.timeout)
            self._emit(ProcessKv(self.spec.replica_id, result))
        self.logger.info("[%s] stopping pid %d: %s", self.label, child.pid, self.stop_reason)
        child.signal_group(signal.SIGTERM)
        await trio.sleep(self.spec.stop_timeout)
        self.logger.warning(
            "[%s] pid %d still running %g s after SIGTERM; sending SIGKILL",
            self.label,
            child.pid,
            self.spec.stop_timeout,
        )
        self.sent_sigkill = True
        child.signal_group(signal.SIGKILL)

    # ---- output ------------------------------------------------------------------------------------

    async def _pump_output(self, stream: trio.lowlevel.FdStream, drained: trio.Event) -> None:
        splitter = LineSplitter()
        try:
            while True:
                try:
                    data = await stream.receive_some(_READ_CHUNK)
                except (trio.ClosedResourceError, OSError):
                    break
                if not data:
                    break
                for line in splitter.feed(data):
                    self._take_line(line)
            for line in splitter.flush():
                self._take_line(line)
        finally:
            drained.set()

    def _take_line(self, line: str) -> None:
        """One output line: into the ring buffer, the replica's file and the router's DEBUG log."""
        self.log.append(line)
        if self.file is not None:
            self.file.write(line)
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
                    if self.stop_reason is None and not self.exit_seen:
                        self.ready = True
                        self.logger.info(
                            "[%s] ready after %.1f s", self.label, trio.current_time() - self.started_clock
                        )
                        self._emit(ProcessReady(spec.replica_id))
                        await self._restore_others(http, restored)
                        await self._watch_ready(http, url)
                    return
            remaining = deadline - trio.current_time()
            since = trio.current_time() - self.started_clock
            interval = min(_HEALTH_INTERVAL, max(_HEALTH_FIRST, since / 10))
            await trio.sleep(max(0.0, min(interval, remaining)))
        if self.stop_reason is not None or self.exit_seen:
            return
        reason = (
            f"llama-server for {spec.model!r} did not answer /health within {spec.load_timeout:g} s; "
            f"log: {quote_lines(self.log)}"
        )
        self.logger.error("[%s] %s", self.label, reason)
        self._emit(ProcessLoadFailed(spec.replica_id, reason))
        self.stop(reason)

    async def _restore(self, http: httpx.AsyncHTTPTransport) -> str | None:
        """Before the replica takes requests: restore the saved state that suits the request loading it.
        Returns that state's name (None: nothing restored)."""
        kv = self.spec.kv
        if kv is None or self.stop_reason is not None or self.exit_seen:
            return None
        result = await restore_into(http, self.spec.port, kv.store, kv.shelf, kv.probe, kv.timeout)
        if result.outcome != "empty":
            self._emit(ProcessKv(self.spec.replica_id, result))
        return result.detail if result.outcome == "restored" else None

    async def _restore_others(self, http: httpx.AsyncHTTPTransport, restored: str | None) -> None:
        """Once the replica serves: its other slots get the next most recently used states."""
        kv = self.spec.kv
        if kv is None or self.stop_reason is not None or self.exit_seen:
            return
        for result in await restore_others(http, self.spec.port, kv.store, kv.shelf, restored, kv.timeout):
            self._emit(ProcessKv(self.spec.replica_id, result))

    async def _watch_ready(self, http: httpx.AsyncHTTPTransport, url: str) -> None:
        """Probe a ready replica's /health; one that answers nothing (any status counts as an answer) for
        ``hang_timeout`` seconds — stopped, deadlocked in a driver call — is killed at once and reported."""
        spec = self.spec
        if spec.hang_timeout is None:
            return
        every = max(0.05, min(_WATCH_EVERY, spec.hang_timeout / 4))
        last_answer = trio.current_time()
        while self.stop_reason is None and not self.exit_seen:
            await trio.sleep(every)
            try:
                await _get_status(http, url, max(every, min(_HEALTH_CALL_TIMEOUT * 5, spec.hang_timeout / 2)))
            except httpx.HTTPError:
                silent = trio.current_time() - last_answer
                if silent < spec.hang_timeout or self.stop_reason is not None or self.exit_seen:
                    continue
                reason = f"no answer to /health for {silent:.0f} s (hang_timeout = {spec.hang_timeout:g})"
                self.logger.error("[%s] %s: killing it", self.label, reason)
                self.stop_reason = f"not responding: {reason}"
                self.stop_requested.set()
                if self.child is not None:
                    self.child.signal_group(signal.SIGKILL)  # a stopped or hung process ignores SIGTERM
                self._emit(ProcessUnresponsive(spec.replica_id, reason))
                return
            else:
                last_answer = trio.current_time()

    # ---- the end -----------------------------------------------------------------------------------

    def _exit_reason(self) -> str:
        if self.stop_reason is not None and not self._died_by_itself():
            return f"stopped: {self.stop_reason}"
        phase = "while loading" if not self.ready else "after it was ready"
        how = describe_returncode(self.returncode)
        stopping = f", as it was being stopped ({self.stop_reason})" if self.stop_reason is not None else ""
        return (
            f"llama-server for {self.spec.model!r} exited with {how} {phase}{stopping}; "
            f"log: {quote_lines(self.log, cause=not self.ready)}"
        )

    def _died_by_itself(self) -> bool:
        """It was asked to stop, yet its exit status is not one the stop accounts for: it crashed on its own
        (a replica that broke off a reply is often stopped as it dies), and its own failure is the news."""
        code = self.returncode
        if code is None or code in _STOPPED_BY_SIGTERM:
            return False
        return not (self.sent_sigkill and code in _STOPPED_BY_SIGKILL)

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
        asked = self.stop_reason is not None
        self._emit(ProcessExited(self.spec.replica_id, returncode, not self.ready, reason, asked))

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
