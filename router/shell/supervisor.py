"""llama-server processes: start them, watch /health, keep their logs, reap them, stop them.

The supervisor never decides when a replica should exist; whoever calls ``spawn`` and ``kill`` does. It
reports what happened to each process through one callback, always from the Trio thread:

* ``ProcessReady`` once /health has answered 200;
* ``ProcessLoadFailed`` when /health did not answer 200 within the load timeout (the process is then
  being stopped, and a ``ProcessExited`` follows);
* ``ProcessExited`` exactly once per spawned replica, after the process has been reaped.

Every child runs in its own process group, so stopping a replica signals everything it started. On Linux
each child also asks the kernel to SIGKILL it when the thread that forked it dies, so a router killed with
SIGKILL leaves no llama-server behind. That request is tied to the forking *thread*, which is why the fork
happens here, in the Trio thread, rather than in a worker thread as ``trio.lowlevel.open_process`` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping

import attrs
import httpx
import trio

from router.shell.logring import LineSplitter, quote_lines
from router.shell.ports import free_port
from router.shell.replica_logs import ReplicaLogFile, ReplicaLogs

__all__ = [
    "LaunchSpec",
    "ProcessExited",
    "ProcessLoadFailed",
    "ProcessReady",
    "ReplicaProcessInfo",
    "Supervisor",
    "SupervisorEvent",
    "free_port",
]

_HEALTH_INTERVAL = 0.1  # seconds between /health probes while loading
_HEALTH_FIRST = 0.01  # the first probes come faster: small models are ready in well under a second
_HEALTH_CALL_TIMEOUT = 1.0  # seconds one /health probe may take
_WATCH_EVERY = 5.0  # seconds between /health probes of a ready replica (at most)
_SHUTDOWN_GRACE = 3.0  # most seconds between SIGTERM and SIGKILL when the supervisor itself is cancelled
_KILL_WAIT = 10.0  # seconds to wait for a SIGKILLed child during shutdown before giving up on it
_DRAIN_WAIT = 2.0  # seconds to wait for the output pipe to reach EOF after the child is reaped
_READ_CHUNK = 65536


@attrs.frozen
class LaunchSpec:
    """Everything needed to start one llama-server replica."""

    replica_id: int
    model: str
    argv: tuple[str, ...] = attrs.field(converter=tuple)
    env: Mapping[str, str] = attrs.field(factory=dict)
    port: int = 0
    load_timeout: float = 120.0
    stop_timeout: float = 10.0
    cwd: str | None = None  # relative paths in the argv start here (the config file's directory)
    # A ready replica that answers no /health probe for this long is declared hung (None: never).
    hang_timeout: float | None = 30.0


@attrs.frozen
class ProcessReady:
    replica_id: int


@attrs.frozen
class ProcessLoadFailed:
    replica_id: int
    reason: str


@attrs.frozen
class ProcessUnresponsive:
    """A ready replica stopped answering /health; the supervisor has already sent it SIGKILL."""

    replica_id: int
    reason: str


@attrs.frozen
class ProcessExited:
    """The process is gone. ``asked``: the supervisor stopped it (a ``kill``, a load that timed out, a hung
    replica, the supervisor's own shutdown); False when it crashed or could not start."""

    replica_id: int
    returncode: int | None
    during_load: bool
    reason: str
    asked: bool


SupervisorEvent = ProcessReady | ProcessLoadFailed | ProcessUnresponsive | ProcessExited


@attrs.frozen
class ReplicaProcessInfo:
    """A snapshot of one replica's process, for status pages and error messages."""

    replica_id: int
    model: str
    pid: int | None
    port: int
    argv: tuple[str, ...]
    started_at: float | None  # wall-clock seconds (time.time()) when the process was started
    ready: bool
    exited: bool
    returncode: int | None
    stop_reason: str | None
    log_path: str | None = None  # the replica's log file, when it has one


class _Child:
    """One started process: its Popen, the read end of its merged output and, on Linux, a pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes], output: trio.lowlevel.FdStream, pidfd: int | None):
        self.popen = popen
        self.output = output
        self.pidfd = pidfd

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def reaped(self) -> bool:
        return self.popen.returncode is not None

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the child's process group.

        Only while the child is unreaped: until then its pid (which is also the group id) cannot be
        reused, so the signal cannot reach a stranger.
        """
        if self.reaped:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def has_exited(self) -> bool:
        """Whether the child has exited, without reaping it."""
        if self.reaped:
            return True
        try:
            status = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return status is not None

    async def wait_exited(self) -> None:
        """Return once the child has exited; it stays unreaped (a zombie) until ``reap``."""
        if self.reaped:
            return
        if self.pidfd is not None:
            await trio.lowlevel.wait_readable(self.pidfd)
            return
        while not self.has_exited():
            await trio.sleep(0.05)

    def reap(self) -> int | None:
        """Kill whatever is left of the group, then collect the exit status. Never blocks."""
        if not self.reaped and self.has_exited():
            self.signal_group(signal.SIGKILL)
        return self.popen.poll()

    def close(self) -> None:
        self.output.close()
        if self.pidfd is not None:
            trio.lowlevel.notify_closing(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None


@attrs.define(eq=False)
class _Replica:
    spec: LaunchSpec
    log: deque[str]
    file: ReplicaLogFile | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    stop_requested: trio.Event = attrs.field(factory=trio.Event)
    child: _Child | None = None
    started_at: float | None = None
    started_clock: float = 0.0
    ready: bool = False
    exit_seen: bool = False
    finished: bool = False
    returncode: int | None = None
    stop_reason: str | None = None

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


class Supervisor:
    """Runs llama-server processes inside its own nursery and reports what becomes of them."""

    def __init__(
        self,
        report: Callable[[SupervisorEvent], None],
        *,
        log_lines: int = 400,
        logger: logging.Logger | None = None,
        keep_exited: int = 64,
        log_files: ReplicaLogs | None = None,
    ) -> None:
        self._report = report
        self._log_lines = log_lines
        self._log_files = log_files
        self._log = logger if logger is not None else logging.getLogger("router.replica")
        self._keep_exited = keep_exited
        self._live: dict[int, _Replica] = {}
        self._exited: OrderedDict[int, _Replica] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._http: httpx.AsyncHTTPTransport | None = None
        self._closing = False
        self._closed = trio.Event()

    # ---- lifecycle -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the replicas' tasks. Returns after ``aclose``; if cancelled, stops every child first."""
        if self._nursery is not None:
            raise RuntimeError("Supervisor.run() is already running")
        # A bare transport rather than a client: no proxy settings from the environment, and no INFO log
        # line per request (the client logs every request, which at 10 probes a second buries the log).
        http = httpx.AsyncHTTPTransport(retries=0)
        self._http = http
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._closed.wait()
        finally:
            self._nursery = None
            self._http = None
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await http.aclose()

    async def aclose(self) -> None:
        """Stop every replica (SIGTERM, then SIGKILL after its stop_timeout), wait until all are reaped,
        and let ``run`` return."""
        self._closing = True
        for rep in list(self._live.values()):
            self.kill(rep.spec.replica_id, "supervisor closing")
        for rep in list(self._live.values()):
            await rep.done.wait()
        self._closed.set()

    # ---- commands --------------------------------------------------------------------------------

    def spawn(self, spec: LaunchSpec) -> None:
        """Start a replica's task; the process itself is started by that task, moments later."""
        if self._nursery is None or self._closing:
            raise RuntimeError("Supervisor is not running")
        if spec.replica_id in self._live:
            raise ValueError(f"replica {spec.replica_id} is already running")
        if not spec.argv:
            raise ValueError("LaunchSpec.argv is empty")
        self._exited.pop(spec.replica_id, None)
        rep = _Replica(spec=spec, log=deque(maxlen=self._log_lines))
        if self._log_files is not None:
            rep.file = self._log_files.open(
                spec.model,
                spec.replica_id,
                f"replica {spec.replica_id} of {spec.model}: {' '.join(spec.argv)}",
            )
        self._live[spec.replica_id] = rep
        self._nursery.start_soon(self._run_replica, rep, name=f"replica {rep.label}")

    def kill(self, replica_id: int, reason: str) -> None:
        """Stop a replica: its task SIGTERMs the process group at once and SIGKILLs it after stop_timeout.

        Idempotent: later calls keep the first reason. Unknown or already exited replicas are ignored.
        """
        rep = self._live.get(replica_id)
        if rep is None or rep.exit_seen or rep.stop_reason is not None:
            return
        rep.stop_reason = reason
        rep.stop_requested.set()

    # ---- queries ---------------------------------------------------------------------------------

    def logs(self, replica_id: int) -> list[str]:
        """The last ``log_lines`` output lines of a replica (kept for a while after it exits)."""
        rep = self._find(replica_id)
        return list(rep.log) if rep is not None else []

    def log_file(self, replica_id: int) -> ReplicaLogFile | None:
        """The log file of a replica (kept for a while after it exits), if it has one."""
        rep = self._find(replica_id)
        return rep.file if rep is not None else None

    def info(self, replica_id: int) -> ReplicaProcessInfo | None:
        rep = self._find(replica_id)
        return rep.snapshot() if rep is not None else None

    def _find(self, replica_id: int) -> _Replica | None:
        rep = self._live.get(replica_id)
        return rep if rep is not None else self._exited.get(replica_id)

    # ---- one replica -----------------------------------------------------------------------------

    async def _run_replica(self, rep: _Replica) -> None:
        try:
            await self._supervise(rep)
        finally:
            rep.finished = True
            if self._live.get(rep.spec.replica_id) is rep:
                del self._live[rep.spec.replica_id]
            self._exited[rep.spec.replica_id] = rep
            while len(self._exited) > self._keep_exited:
                self._exited.popitem(last=False)
            rep.done.set()

    async def _supervise(self, rep: _Replica) -> None:
        spec = rep.spec
        if rep.stop_reason is not None:
            self._finish(rep, None, f"stopped: {rep.stop_reason}")
            return
        try:
            child = _launch(spec)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = (
                f"could not start llama-server for {spec.model!r}: {spec.argv[0]}: {_describe_os_error(exc)}"
            )
            self._finish(rep, None, reason)
            return
        rep.child = child
        rep.started_at = time.time()
        rep.started_clock = trio.current_time()
        if rep.file is not None:
            rep.file.note(f"started pid {child.pid} on port {spec.port}")
        self._log.info(
            "[%s] started pid %d on port %d: %s", rep.label, child.pid, spec.port, " ".join(spec.argv)
        )
        try:
            async with trio.open_nursery() as outer:
                drained = trio.Event()
                outer.start_soon(self._pump_output, rep, child.output, drained)
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(self._probe_health, rep)
                    watchers.start_soon(self._stop_when_asked, rep, child)
                    await child.wait_exited()
                    rep.exit_seen = True
                    watchers.cancel_scope.cancel()
                rep.returncode = child.reap()
                with trio.move_on_after(_DRAIN_WAIT):
                    await drained.wait()
                outer.cancel_scope.cancel()
        finally:
            if not child.reaped:
                # Cancelled (or failed) while the child still runs: stop it before letting go.
                with trio.CancelScope(shield=True):
                    if rep.stop_reason is None:
                        rep.stop_reason = "supervisor shutting down"
                    rep.exit_seen = True
                    rep.returncode = await self._terminate(rep, child)
            child.close()
            self._finish(rep, rep.returncode, self._exit_reason(rep))

    async def _terminate(self, rep: _Replica, child: _Child) -> int | None:
        """SIGTERM, a short grace period, SIGKILL, reap. Used when the supervisor itself is cancelled."""
        child.signal_group(signal.SIGTERM)
        with trio.move_on_after(min(rep.spec.stop_timeout, _SHUTDOWN_GRACE)):
            await child.wait_exited()
        child.signal_group(signal.SIGKILL)
        with trio.move_on_after(_KILL_WAIT):
            await child.wait_exited()
        returncode = child.reap()
        if returncode is None:
            self._log.error(
                "[%s] pid %d survived SIGKILL for %g s; giving up on it", rep.label, child.pid, _KILL_WAIT
            )
        return returncode

    async def _stop_when_asked(self, rep: _Replica, child: _Child) -> None:
        await rep.stop_requested.wait()
        self._log.info("[%s] stopping pid %d: %s", rep.label, child.pid, rep.stop_reason)
        child.signal_group(signal.SIGTERM)
        await trio.sleep(rep.spec.stop_timeout)
        self._log.warning(
            "[%s] pid %d still running %g s after SIGTERM; sending SIGKILL",
            rep.label,
            child.pid,
            rep.spec.stop_timeout,
        )
        child.signal_group(signal.SIGKILL)

    async def _pump_output(self, rep: _Replica, stream: trio.lowlevel.FdStream, drained: trio.Event) -> None:
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
                    self._take_line(rep, line)
            for line in splitter.flush():
                self._take_line(rep, line)
        finally:
            drained.set()

    def _take_line(self, rep: _Replica, line: str) -> None:
        """One output line: into the ring buffer, the replica's file and the router's DEBUG log."""
        rep.log.append(line)
        if rep.file is not None:
            rep.file.write(line)
        self._log.debug("[%s] %s", rep.label, line)

    async def _probe_health(self, rep: _Replica) -> None:
        spec = rep.spec
        http = self._http
        assert http is not None
        url = f"http://127.0.0.1:{spec.port}/health"
        deadline = rep.started_clock + spec.load_timeout
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
                    if rep.stop_reason is None and not rep.exit_seen:
                        rep.ready = True
                        self._log.info(
                            "[%s] ready after %.1f s", rep.label, trio.current_time() - rep.started_clock
                        )
                        self._emit(ProcessReady(spec.replica_id))
                        await self._watch_ready(rep, http, url)
                    return
            remaining = deadline - trio.current_time()
            since = trio.current_time() - rep.started_clock
            interval = min(_HEALTH_INTERVAL, max(_HEALTH_FIRST, since / 10))
            await trio.sleep(max(0.0, min(interval, remaining)))
        if rep.stop_reason is not None or rep.exit_seen:
            return
        reason = (
            f"llama-server for {spec.model!r} did not answer /health within {spec.load_timeout:g} s; "
            f"last log lines: {quote_lines(rep.log)}"
        )
        self._log.error("[%s] %s", rep.label, reason)
        self._emit(ProcessLoadFailed(spec.replica_id, reason))
        self.kill(spec.replica_id, reason)

    async def _watch_ready(self, rep: _Replica, http: httpx.AsyncHTTPTransport, url: str) -> None:
        """Probe a ready replica's /health; one that answers nothing (any status counts as an answer) for
        ``hang_timeout`` seconds — stopped, deadlocked in a driver call — is killed at once and reported."""
        spec = rep.spec
        if spec.hang_timeout is None:
            return
        every = max(0.05, min(_WATCH_EVERY, spec.hang_timeout / 4))
        last_answer = trio.current_time()
        while rep.stop_reason is None and not rep.exit_seen:
            await trio.sleep(every)
            try:
                await _get_status(http, url, max(every, min(_HEALTH_CALL_TIMEOUT * 5, spec.hang_timeout / 2)))
            except httpx.HTTPError:
                silent = trio.current_time() - last_answer
                if silent < spec.hang_timeout or rep.stop_reason is not None or rep.exit_seen:
                    continue
                reason = f"no answer to /health for {silent:.0f} s (hang_timeout = {spec.hang_timeout:g})"
                self._log.error("[%s] %s: killing it", rep.label, reason)
                rep.stop_reason = f"not responding: {reason}"
                rep.stop_requested.set()
                if rep.child is not None:
                    rep.child.signal_group(signal.SIGKILL)  # a stopped or hung process ignores SIGTERM
                self._emit(ProcessUnresponsive(spec.replica_id, reason))
                return
            else:
                last_answer = trio.current_time()

    def _exit_reason(self, rep: _Replica) -> str:
        if rep.stop_reason is not None:
            return f"stopped: {rep.stop_reason}"
        phase = "while loading" if not rep.ready else "after it was ready"
        how = _describe_returncode(rep.returncode)
        return f"llama-server for {rep.spec.model!r} exited with {how} {phase}; log: {quote_lines(rep.log)}"

    def _finish(self, rep: _Replica, returncode: int | None, reason: str) -> None:
        rep.returncode = returncode
        if rep.file is not None:
            rep.file.note(f"exited ({_describe_returncode(returncode)}): {reason}")
            if self._log_files is not None:
                self._log_files.closed(rep.file)
        if rep.stop_reason is not None:
            self._log.info("[%s] exited (%s): %s", rep.label, _describe_returncode(returncode), reason)
        else:
            self._log.warning("[%s] %s", rep.label, reason)
        asked = rep.stop_reason is not None
        self._emit(ProcessExited(rep.spec.replica_id, returncode, not rep.ready, reason, asked))

    def _emit(self, event: SupervisorEvent) -> None:
        try:
            self._report(event)
        except Exception:
            self._log.exception("report callback failed for %r", event)


async def _get_status(http: httpx.AsyncHTTPTransport, url: str, timeout: float) -> int:
    request = httpx.Request("GET", url, extensions={"timeout": httpx.Timeout(timeout).as_dict()})
    response = await http.handle_async_request(request)
    try:
        await response.aread()
    finally:
        await response.aclose()
    return response.status_code


# ---- starting a process ----------------------------------------------------------------------------


def _launch(spec: LaunchSpec) -> _Child:
    """Fork and exec in the calling (Trio) thread, with merged stdout/stderr on a pipe."""
    env = {**os.environ, **spec.env}
    read_fd, write_fd = os.pipe()
    try:
        popen = subprocess.Popen(
            list(spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            env=env,
            cwd=spec.cwd,
            close_fds=True,
            start_new_session=True,
            preexec_fn=_death_signal_hook(),
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    try:
        pidfd: int | None = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):
        pidfd = None
    return _Child(popen, trio.lowlevel.FdStream(read_fd), pidfd)


_PR_SET_PDEATHSIG = 1


def _death_signal_hook() -> Callable[[], None] | None:
    """A preexec function that makes the kernel SIGKILL the child when its parent thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        # The parent may have died between fork and prctl; then nobody would ever signal us.
        if os.getppid() != parent:
            os._exit(1)

    return hook


def _describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "unknown status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
