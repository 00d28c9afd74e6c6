"""What a process supervisor is given, what it reports, and the interface the owner task drives it through.

The owner task (``router.shell.runtime``) decides when a replica should exist; a supervisor starts and
stops the processes and reports what becomes of them, one value per happening, through a callback it is
given at construction:

* ``ReplicaReady`` once /health has answered 200;
* ``LoadFailed`` when /health did not answer 200 within the load timeout (the process is then being
  stopped, and a ``ReplicaExited`` follows);
* ``ReplicaUnresponsive`` when a ready replica stopped answering /health (it has already been killed);
* ``ReplicaKv`` after saving a replica's slots (before it is stopped) or restoring a saved state into it
  (before ``ReplicaReady``);
* ``ReplicaExited`` exactly once per spawned replica, after the process has been reaped.

The first four are the scheduler's own events (``statemachine.events``): a fact keeps one name from the
process to the scheduler. What the shell alone needs of an exit (its status, whether we stopped it, whether
it ever served) is in the replica's ``info`` snapshot, current when the report is made.

:class:`ProcessSupervisor` is all the owner task and the status pages need of a supervisor; the real one
is ``router.shell.supervisor.Supervisor``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import attrs
import trio

from router.shell.kv_slots import KvOutcome
from router.shell.kv_store import KvStore
from router.shell.prompts import PromptProbe
from router.shell.replica_logs import ReplicaLogFile
from statemachine.events import LoadFailed, ReplicaExited, ReplicaReady, ReplicaUnresponsive

__all__ = [
    "KvLaunch",
    "LaunchSpec",
    "ProcessSupervisor",
    "ReplicaKv",
    "ReplicaProcessInfo",
    "Report",
    "SupervisorEvent",
    "SupervisorFactory",
]


@attrs.frozen
class KvLaunch:
    """A replica whose slots are saved before it stops and restored when it starts: its ``shelf`` in
    ``store`` (also its ``--slot-save-path``), the prompt of the request that loads it (None: restore the most
    recent state), and the most seconds a save or a restore may take."""

    store: KvStore
    shelf: Path
    probe: PromptProbe | None
    timeout: float


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
    hang_timeout: float | None = 4.0
    kv: KvLaunch | None = None  # None: no saved states (the model or the router opted out)


@attrs.frozen
class ReplicaKv:
    """A save of the replica's slots before it stopped, or a restore into it before it was declared ready."""

    replica: int
    result: KvOutcome


SupervisorEvent = ReplicaReady | LoadFailed | ReplicaUnresponsive | ReplicaExited | ReplicaKv
Report = Callable[[SupervisorEvent], None]


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
    unresponsive: bool = False  # killed for leaving its /health unanswered for hang_timeout


class ProcessSupervisor(Protocol):
    """Starts and stops replica processes and reports on them through the callback it was built with."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the replicas' tasks until cancelled; ``task_status.started()`` once ``spawn`` may be called."""
        ...

    def spawn(self, spec: LaunchSpec) -> None:
        """Start the replica ``spec`` describes; its reports follow through the callback."""
        ...

    def kill(self, replica_id: int, reason: str, *, save: bool = False) -> None:
        """Stop a replica; idempotent, and unknown or exited replicas are ignored. ``save``: first save its
        slots (when it was started with ``kv``), for at most its ``kv.timeout`` seconds."""
        ...

    def info(self, replica_id: int) -> ReplicaProcessInfo | None:
        """A snapshot of the replica's process (kept for a while after it exits), or None."""
        ...

    def logs(self, replica_id: int) -> list[str]:
        """The replica's last output lines (empty when none are kept)."""
        ...

    def log_file(self, replica_id: int) -> ReplicaLogFile | None:
        """The replica's log file, if it has one."""
        ...


# Builds the supervisor a Router uses, given the callback its reports go to.
SupervisorFactory = Callable[[Report], ProcessSupervisor]
