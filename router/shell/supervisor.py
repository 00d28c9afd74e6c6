"""llama-server processes: start them, watch /health, keep their logs, reap them, stop them.

The supervisor never decides when a replica should exist; whoever calls ``spawn`` and ``kill`` does. It
reports what happened to each process through one callback, always from the Trio thread (the values and
their order are described in ``router.shell.processes``). Each replica is a
:class:`~router.shell.replica_task.ReplicaTask` in the supervisor's nursery; the process itself is handled
by ``router.shell.child``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque

import httpx
import trio

from router.shell.processes import LaunchSpec, ReplicaProcessInfo, Report
from router.shell.replica_logs import ReplicaLogFile, ReplicaLogs
from router.shell.replica_task import ProcessPhase, ReplicaTask

__all__ = ["Supervisor"]


class Supervisor:
    """Runs llama-server processes inside its own nursery and reports what becomes of them."""

    def __init__(
        self,
        report: Report,
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
        self._live: dict[int, ReplicaTask] = {}
        self._exited: OrderedDict[int, ReplicaTask] = OrderedDict()
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
        # No idle connection is kept: llama-server waits about 0.1 s for each one before it exits.
        http = httpx.AsyncHTTPTransport(retries=0, limits=httpx.Limits(max_keepalive_connections=0))
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
        rep = ReplicaTask(
            spec=spec,
            log=deque(maxlen=self._log_lines),
            report=self._report,
            logger=self._log,
            log_files=self._log_files,
        )
        if self._log_files is not None:
            rep.file = self._log_files.open(
                spec.model,
                spec.replica_id,
                f"replica {spec.replica_id} of {spec.model}: {' '.join(spec.argv)}",
            )
        self._live[spec.replica_id] = rep
        self._nursery.start_soon(self._run_replica, rep, name=f"replica {rep.label}")

    def kill(self, replica_id: int, reason: str, *, save: bool = False) -> None:
        """Stop a replica: its task SIGTERMs the process group at once (after saving its slots when ``save``
        and it was started with ``kv``) and SIGKILLs it after stop_timeout.

        Idempotent: later calls keep the first reason. Unknown or already exited replicas are ignored.
        """
        rep = self._live.get(replica_id)
        if rep is not None:
            rep.stop(reason, save=save)

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

    def _find(self, replica_id: int) -> ReplicaTask | None:
        rep = self._live.get(replica_id)
        return rep if rep is not None else self._exited.get(replica_id)

    # ---- one replica -----------------------------------------------------------------------------

    async def _run_replica(self, rep: ReplicaTask) -> None:
        try:
            assert self._http is not None  # set for as long as the nursery runs
            await rep.run(self._http)
        finally:
            if rep.phase is ProcessPhase.EXITED:  # its exit is reported (a run that failed first raises on)
                rep.retire()
            if self._live.get(rep.spec.replica_id) is rep:
                del self._live[rep.spec.replica_id]
            self._exited[rep.spec.replica_id] = rep
            while len(self._exited) > self._keep_exited:
                self._exited.popitem(last=False)
            rep.done.set()
