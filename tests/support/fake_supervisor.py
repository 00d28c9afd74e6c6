"""The process boundary, faked: a supervisor that starts nothing, and a real Router driven through it.

:class:`FakeSupervisor` satisfies ``router.shell.processes.ProcessSupervisor``. It records every ``spawn``
and ``kill`` with the Trio time it came, and the test plays the processes: ``ready``, ``load_failed``,
``unresponsive`` and ``exit`` send the reports a real supervisor would, through the Router's own callback.
It refuses reports no real supervisor could send (a report about a replica never spawned, anything after
its exit), so a test cannot drive the Router into a state production never sees.

:func:`owned_router` builds a real deployment (``prepare`` on a configuration of simulated models), a
strict Router over a FakeSupervisor and, when given, a stand-in GPU reader, and runs it in the test's Trio
run. Nothing waits on a wall clock: with pytest-trio's ``autojump_clock`` (or ``mock_clock``) a test that
sleeps through a ten-minute idle timeout takes milliseconds. :func:`settle` lets every task run until all
are blocked again, so that what the test did has been fed to the scheduler and carried out.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from router.config.load import config_from_dict
from router.deploy.deployment import prepare
from router.hosts.gpu_monitor import GpuMonitor
from router.hosts.gpu_readers import GpuSource
from router.placement.readings import GpuReading
from router.shell.child import describe_returncode
from router.shell.processes import LaunchSpec, ReplicaProcessInfo, Report
from router.shell.replica_logs import ReplicaLogFile
from router.shell.runtime import Router
from router.shell.ticket import Ticket
from statemachine.events import LoadFailed, ReplicaExited, ReplicaReady, ReplicaUnresponsive
from tests.support.harness import config_document, with_replica_logs, write_config

_pids = itertools.count(40000)


@attrs.define(eq=False)
class FakeProcess:
    """One spawned replica as the fake supervisor keeps it."""

    spec: LaunchSpec
    spawned_at: float  # trio.current_time() of the spawn
    pid: int
    ready: bool = False
    exited: bool = False
    returncode: int | None = None
    stop_reason: str | None = None


@attrs.frozen
class KillCall:
    replica: int
    reason: str
    at: float  # trio.current_time() of the call
    save: bool = False  # the router asked for the replica's slots to be saved first


class FakeSupervisor:
    """Records the Router's commands; the test decides what each "process" does, and when."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.spawns: list[LaunchSpec] = []
        self.kills: list[KillCall] = []
        self.processes: dict[int, FakeProcess] = {}
        self.running = False

    # ---- what the Router calls ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.running = True
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self.running = False

    def spawn(self, spec: LaunchSpec) -> None:
        assert self.running, "spawn before the supervisor runs"
        current = self.processes.get(spec.replica_id)
        assert current is None or current.exited, f"replica {spec.replica_id} spawned twice"
        self.spawns.append(spec)
        self.processes[spec.replica_id] = FakeProcess(spec, trio.current_time(), next(_pids))

    def kill(self, replica_id: int, reason: str, *, save: bool = False) -> None:
        self.kills.append(KillCall(replica_id, reason, trio.current_time(), save))
        proc = self.processes.get(replica_id)
        if proc is not None and not proc.exited and proc.stop_reason is None:
            proc.stop_reason = reason

    def info(self, replica_id: int) -> ReplicaProcessInfo | None:
        proc = self.processes.get(replica_id)
        if proc is None:
            return None
        return ReplicaProcessInfo(
            replica_id=replica_id,
            model=proc.spec.model,
            pid=proc.pid,
            port=proc.spec.port,
            argv=proc.spec.argv,
            started_at=None,
            ready=proc.ready,
            exited=proc.exited,
            returncode=proc.returncode,
            stop_reason=proc.stop_reason,
        )

    def logs(self, replica_id: int) -> list[str]:
        return []

    def log_file(self, replica_id: int) -> ReplicaLogFile | None:
        return None

    # ---- what the test plays -----------------------------------------------------------------------

    def live(self, replica_id: int) -> FakeProcess:
        proc = self.processes.get(replica_id)
        assert proc is not None, f"replica {replica_id} was never spawned"
        assert not proc.exited, f"replica {replica_id} has already exited"
        return proc

    def ready(self, replica_id: int) -> None:
        """/health answered 200."""
        proc = self.live(replica_id)
        assert not proc.ready and proc.stop_reason is None
        proc.ready = True
        self.report(ReplicaReady(replica_id))

    def load_failed(self, replica_id: int, reason: str = "did not answer /health") -> None:
        """The load timed out; the real supervisor stops the process next (``exit`` reports that)."""
        proc = self.live(replica_id)
        assert not proc.ready
        proc.stop_reason = reason
        self.report(LoadFailed(replica_id, reason))

    def unresponsive(self, replica_id: int, reason: str = "no answer to /health") -> None:
        """A ready replica went silent; the real supervisor has SIGKILLed it (``exit`` follows)."""
        proc = self.live(replica_id)
        assert proc.ready
        proc.stop_reason = f"not responding: {reason}"
        self.report(ReplicaUnresponsive(replica_id, reason))

    def exit(self, replica_id: int, returncode: int | None = 0) -> None:
        """The process was reaped: the last report about it."""
        proc = self.live(replica_id)
        proc.exited = True
        proc.returncode = returncode
        if proc.stop_reason is not None:
            reason = f"stopped: {proc.stop_reason}"
        else:
            phase = "after it was ready" if proc.ready else "while loading"
            how = describe_returncode(returncode)
            reason = f"llama-server for {proc.spec.model!r} exited with {how} {phase}"
        self.report(ReplicaExited(replica_id, reason))

    def exit_killed(self) -> list[int]:
        """Every replica asked to stop exits now (as a well-behaved llama-server does on SIGTERM)."""
        going = [r for r, p in self.processes.items() if not p.exited and p.stop_reason is not None]
        for replica in going:
            self.exit(replica, returncode=0)
        return going


class FakeGpus:
    """A stand-in GPU reader: the readings are whatever the test sets in ``readings``."""

    kind = "fake"

    def __init__(self, readings: Mapping[int, GpuReading]) -> None:
        self.readings: dict[int, GpuReading] = dict(readings)

    def read(self) -> dict[int, GpuReading]:
        return dict(self.readings)

    def close(self) -> None:
        pass


@attrs.define(eq=False)
class Owned:
    """A running Router over a FakeSupervisor."""

    router: Router
    supervisor: FakeSupervisor
    monitor: GpuMonitor


def ask(router: Router, target: str, tokens: int | None = 16) -> Ticket:
    """What an HTTP handler does when a chat request for ``target`` comes in."""
    return router.admit(target, asked=target, endpoint="/v1/chat/completions", client="test", tokens=tokens)


async def settle() -> None:
    """Let every task run until all of them wait again (the clock does not move meanwhile)."""
    await trio.testing.wait_all_tasks_blocked()


async def dispatched(owned: Owned, target: str = "a") -> Ticket:
    """Ask for ``target``, report its first replica ready, and return the ticket once it is dispatched."""
    ticket = ask(owned.router, target)
    await settle()
    owned.supervisor.ready(owned.supervisor.spawns[-1].replica_id)
    await ticket.decided.wait()
    return ticket


@contextlib.asynccontextmanager
async def owned_router(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    launcher: Path,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    gpus: GpuSource | None = None,
    strict: bool = True,
) -> AsyncIterator[Owned]:
    """A real Router for simulated ``models`` (see ``harness.config_document``), its supervisor faked.

    ``launcher`` is the llama-server binary the deployment checks flags against (one per test session
    keeps that check to a single ``--help``); ``gpus`` the GPU reader (None: no GPU readable)."""
    table = {"llama_server": str(launcher), **(router or {})}
    doc = with_replica_logs(dir, config_document(dir, models, router=table, devices=devices))
    config = config_from_dict(doc, write_config(dir, doc))
    monitor = GpuMonitor(opener=lambda: gpus)
    made: list[FakeSupervisor] = []

    def make(report: Report) -> FakeSupervisor:
        made.append(FakeSupervisor(report))
        return made[-1]

    owner = Router(prepare(config, monitor), gpus=monitor, supervisor=make, strict=strict)
    async with trio.open_nursery() as nursery:
        await nursery.start(owner.run)
        await settle()
        yield Owned(owner, made[0], monitor)
        nursery.cancel_scope.cancel()
