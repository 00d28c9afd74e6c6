"""One llama-server process at the operating-system level: fork it, signal its group, wait for it, reap it.

Every child runs in its own process group, so stopping a replica signals everything it started. On Linux
each child also asks the kernel to SIGKILL it when the thread that forked it dies, so a router killed with
SIGKILL leaves no llama-server behind. That request is tied to the forking *thread*, which is why
:func:`launch` forks in the calling (Trio) thread rather than in a worker thread as
``trio.lowlevel.open_process`` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import trio

from router.shell.processes import LaunchSpec

__all__ = ["Child", "describe_os_error", "describe_returncode", "launch"]


class Child:
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


def launch(spec: LaunchSpec) -> Child:
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
    return Child(popen, trio.lowlevel.FdStream(read_fd), pidfd)


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


def describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "unknown status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
