"""The router as a process of its own (``python -m router --config FILE``), for tests that signal it, watch
it exit or share one router across a module.

``router_process(dir, models)`` writes the configuration for simulated ``models`` (see
``tests.support.simconfig``) and starts the router inside the test's Trio run; ``process_serving_sync``
starts it outside Trio.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from tests.support import REPO
from tests.support.client import wait_health
from tests.support.processes import Launched, launched
from tests.support.simconfig import config_document, write_config
from tests.support.waiting import until


@attrs.define(eq=False)
class RouterProcess:
    """``python -m router`` running in a process of its own."""

    process: trio.Process
    url: str
    client: httpx.AsyncClient
    dir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def status(self) -> dict[str, Any]:
        response = await self.client.get("/status")
        response.raise_for_status()
        return dict(response.json())

    async def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> Any:
        """Poll /status until ``predicate`` holds; return the document."""

        async def holds() -> dict[str, Any] | None:
            doc = await self.status()
            return doc if predicate(doc) else None

        return await until(holds, timeout=timeout, what="/status condition")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def wait_exit(self, timeout: float = 15.0) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def router_process(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
) -> AsyncIterator[RouterProcess]:
    """Start ``python -m router --config FILE`` for simulated ``models``; kill it (if still alive) after."""
    doc = config_document(dir, models, router=router, devices=devices, defaults=defaults, pools=pools)
    async with process_serving(dir, doc) as handle:
        yield handle


@contextlib.asynccontextmanager
async def process_serving(dir: Path, doc: Mapping[str, Any]) -> AsyncIterator[RouterProcess]:
    """Write ``doc`` and start ``python -m router --config FILE`` on it; kill it (if still alive) after."""
    path = write_config(dir, doc)
    url = router_url(doc)
    log_path = dir / "router.log"
    with log_path.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            router_command(path),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=router_env(),
            cwd=str(REPO),
        )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            try:
                await wait_health(client)
            except trio.TooSlowError:
                raise RuntimeError(f"the router did not start; its log:\n{log_path.read_text()}") from None
            yield RouterProcess(process, url, client, dir, log_path)
    finally:
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(5):
                await process.wait()


@contextlib.contextmanager
def process_serving_sync(
    dir: Path, doc: Mapping[str, Any], *, ready_timeout: float = 30.0, stop_timeout: float = 20.0
) -> Iterator[Launched]:
    """:func:`process_serving` for a test (or a module-wide fixture) outside Trio: write ``doc``, start
    ``python -m router --config FILE`` on it; SIGTERM it after (SIGKILL past ``stop_timeout``)."""
    path = write_config(dir, doc)
    argv = router_command(path)
    log_path = dir / "router.log"
    with launched(
        argv,
        router_url(doc),
        log_path,
        name="the router",
        env=router_env(),
        cwd=REPO,
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
    ) as served:
        yield served


def router_command(config: Path) -> list[str]:
    """The command line that runs the router on the configuration file ``config``."""
    return [sys.executable, "-m", "router", "--config", str(config)]


def router_env() -> dict[str, str]:
    """This process's environment for the router's: the repository leads ``PYTHONPATH``, and the router
    does not inherit the name of the test that started it."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def router_url(doc: Mapping[str, Any]) -> str:
    return f"http://{doc['router']['host']}:{doc['router']['port']}"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a process that still runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


async def wait_pid_gone(pid: int, timeout: float = 5.0) -> None:
    await until(lambda: not pid_alive(pid), timeout=timeout, what=f"pid {pid} gone")
