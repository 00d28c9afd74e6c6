"""The llama-server process supervisor, driven against the simulated llama-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from router.shell.logring import LineSplitter, telling_lines
from router.shell.ports import free_port
from router.shell.processes import LaunchSpec, SupervisorEvent
from router.shell.supervisor import Supervisor
from statemachine.events import LoadFailed, ReplicaExited, ReplicaReady
from tests.support.simserver.handler import HEALTH_HELD
from tests.support.simserver.main import SIGTERM_IGNORED
from tests.support.simtools import read_records, sim_launcher, write_sim_model
from tests.support.waiting import until

REPO = Path(__file__).resolve().parents[2]
LINUX = sys.platform.startswith("linux")


@attrs.frozen
class Exit:
    """A ``ReplicaExited`` report with what the supervisor's snapshot of the replica said as it came."""

    replica: int
    reason: str
    returncode: int | None
    during_load: bool
    asked: bool


@attrs.define(eq=False)
class Recorder:
    """The supervisor's report callback: keeps every event with the Trio time it arrived (an exit as an
    :class:`Exit`, read off ``supervisor.info`` at that moment)."""

    events: list[tuple[float, SupervisorEvent | Exit]] = attrs.field(factory=list)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    on_report: Callable[[SupervisorEvent], None] | None = None  # called as each report comes
    supervisor: Supervisor | None = None

    def __call__(self, event: SupervisorEvent) -> None:
        kept: SupervisorEvent | Exit = event
        if isinstance(event, ReplicaExited):
            assert self.supervisor is not None, "an exit's details are read off the supervisor"
            info = self.supervisor.info(event.replica)
            assert info is not None and not info.exited  # reported before the task is retired
            asked = info.stop_reason is not None
            kept = Exit(event.replica, event.reason, info.returncode, not info.ready, asked)
        self.events.append((trio.current_time(), kept))
        if self.on_report is not None:
            self.on_report(event)
        self._changed.set()
        self._changed = trio.Event()

    def of(self, replica_id: int) -> list[SupervisorEvent | Exit]:
        return [e for _, e in self.events if e.replica == replica_id]

    async def wait_for(self, kind: type[Any], replica_id: int, timeout: float = 20.0) -> tuple[float, Any]:
        with trio.fail_after(timeout):
            while True:
                for at, event in self.events:
                    if isinstance(event, kind) and event.replica == replica_id:
                        return at, event
                await self._changed.wait()


@pytest.fixture
async def sup(nursery: trio.Nursery) -> AsyncIterator[tuple[Supervisor, Recorder]]:
    recorder = Recorder()
    supervisor = recorder.supervisor = Supervisor(recorder)
    await nursery.start(supervisor.run)
    yield supervisor, recorder
    await supervisor.aclose()


def sim_spec(
    dir: Path,
    replica_id: int,
    *,
    load_timeout: float = 20.0,
    stop_timeout: float = 5.0,
    env: dict[str, str] | None = None,
    **behaviour: Any,
) -> LaunchSpec:
    name = f"m{replica_id}"
    model = write_sim_model(dir, name, **behaviour)
    port = free_port()
    argv = (
        str(sim_launcher(dir)),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-ngl",
        "99",
    )
    return LaunchSpec(
        replica_id=replica_id,
        model=name,
        argv=argv,
        env=env or {},
        port=port,
        load_timeout=load_timeout,
        stop_timeout=stop_timeout,
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    if LINUX:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_ready_after_load_delay_then_stopped(sup: tuple[Supervisor, Recorder], tmp_path: Path) -> None:
    supervisor, rec = sup
    records = tmp_path / "records"
    spec = sim_spec(tmp_path, 1, load_delay=0.5, record_dir=records)
    loaded_when_ready: list[list[bool]] = []  # what the child's start record said as Ready came

    def on_report(event: SupervisorEvent) -> None:
        if isinstance(event, ReplicaReady):
            loaded_when_ready.append([r.get("loaded", False) for r in read_records(records)])

    rec.on_report = on_report
    supervisor.spawn(spec)
    await rec.wait_for(ReplicaReady, 1)
    assert loaded_when_ready == [[True]]  # reported once the load was over, not as the child listened
    info = supervisor.info(1)
    assert info is not None and info.pid is not None
    assert info.ready and not info.exited and info.port == spec.port and info.argv == spec.argv
    assert alive(info.pid)

    supervisor.kill(1, "model evicted")
    _, exited = await rec.wait_for(Exit, 1)
    assert any("model loaded" in line for line in supervisor.logs(1))
    assert exited.reason == "stopped: model evicted" and exited.asked
    assert not exited.during_load
    assert not alive(info.pid)
    assert rec.of(1) == [ReplicaReady(1), exited]
    after = supervisor.info(1)
    assert after is not None and after.exited and after.returncode == exited.returncode


async def test_env_reaches_the_child(sup: tuple[Supervisor, Recorder], tmp_path: Path) -> None:
    supervisor, rec = sup
    records = tmp_path / "records"
    env = {"CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}
    supervisor.spawn(sim_spec(tmp_path, 2, env=env, record_dir=records, load_delay=0.0))
    await rec.wait_for(ReplicaReady, 2)
    [record] = read_records(records)
    assert record["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert record["env"]["HIP_VISIBLE_DEVICES"] == "1"
    assert record["env"]["PATH"] == os.environ["PATH"]  # merged over the router's environment
    info = supervisor.info(2)
    assert info is not None and record["pid"] == info.pid
    supervisor.kill(2, "done")
    await rec.wait_for(Exit, 2)
    # The output is drained before the exit is reported: the child's line naming the GPU it saw is there.
    [buffer_line] = [line for line in supervisor.logs(2) if "model buffer size" in line]
    assert "ROCm0" in buffer_line  # HIP_VISIBLE_DEVICES made the child see an AMD GPU, not the CPU


async def test_oom_at_load_is_reported_with_the_oom_line(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    supervisor.spawn(sim_spec(tmp_path, 3, oom_at_load=True, load_delay=0.1))
    _, exited = await rec.wait_for(Exit, 3)
    assert exited.during_load and not exited.asked
    assert exited.returncode not in (None, 0)
    assert f"exit code {exited.returncode}" in exited.reason
    oom_lines = [line for line in supervisor.logs(3) if "out of memory" in line]
    assert oom_lines and oom_lines[0].strip() in exited.reason
    assert "m3" in exited.reason
    assert rec.of(3) == [exited]


async def test_exit_at_load_quotes_failure_lines(sup: tuple[Supervisor, Recorder], tmp_path: Path) -> None:
    supervisor, rec = sup
    supervisor.spawn(sim_spec(tmp_path, 4, exit_at_load=3, load_delay=0.0))
    _, exited = await rec.wait_for(Exit, 4)
    assert exited.during_load and exited.returncode == 3
    assert "exit code 3" in exited.reason
    assert "failed to load model" in exited.reason
    assert "starting the main loop" not in exited.reason


async def test_a_crash_while_being_stopped_is_reported_as_the_crash(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    """Asked to stop, it ignores SIGTERM and then fails on its own with exit code 3: the reason is its
    failure and its log, with the stop named beside it, not a plain "stopped"."""
    supervisor, rec = sup
    supervisor.spawn(
        sim_spec(tmp_path, 7, ignore_sigterm=True, exit_at_load=3, load_delay=1.0, stop_timeout=30)
    )
    # Its SIGTERM handler is set before it logs this.
    await until(lambda: any("loading model" in line for line in supervisor.logs(7)), timeout=10)
    supervisor.kill(7, "not needed any more")
    _, exited = await rec.wait_for(Exit, 7)
    assert exited.returncode == 3 and exited.asked
    assert "exit code 3 while loading, as it was being stopped (not needed any more)" in exited.reason
    assert "failed to load model" in exited.reason


async def test_health_hang_fails_load_within_timeout(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    supervisor.spawn(sim_spec(tmp_path, 5, hang_health=True, load_delay=0.0, load_timeout=1.5))
    _, failed = await rec.wait_for(LoadFailed, 5)
    assert "did not answer /health within 1.5 s" in failed.reason
    assert "'m5'" in failed.reason
    _, exited = await rec.wait_for(Exit, 5)
    assert exited.during_load
    assert exited.reason.startswith("stopped: ") and exited.asked
    assert [type(e) for e in rec.of(5)] == [LoadFailed, Exit]
    assert any(HEALTH_HELD in line for line in supervisor.logs(5))  # it asked, and got no answer


async def test_sigterm_ignored_means_sigkill_after_stop_timeout(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    supervisor.spawn(sim_spec(tmp_path, 6, ignore_sigterm=True, load_delay=0.0, stop_timeout=1.5))
    await rec.wait_for(ReplicaReady, 6)
    supervisor.kill(6, "first")
    supervisor.kill(6, "second")  # idempotent: the first reason stays
    _, exited = await rec.wait_for(Exit, 6)
    # SIGTERM first (the child says it ignored it), then SIGKILL.
    assert [line for line in supervisor.logs(6) if SIGTERM_IGNORED in line] == [SIGTERM_IGNORED]
    assert exited.returncode == -signal.SIGKILL
    assert exited.reason == "stopped: first"
    assert len([e for e in rec.of(6) if isinstance(e, Exit)]) == 1


async def test_obedient_child_stops_long_before_stop_timeout(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    supervisor.spawn(sim_spec(tmp_path, 7, load_delay=0.0, stop_timeout=30.0))
    await rec.wait_for(ReplicaReady, 7)
    supervisor.kill(7, "done")
    _, exited = await rec.wait_for(Exit, 7)
    # Gone at SIGTERM (its handler ran): not killed, which would have come 30 s on.
    assert exited.returncode == 0 and any("cleaning up before exit" in line for line in supervisor.logs(7))


async def test_kill_during_load_reports_exit_during_load(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    supervisor.spawn(sim_spec(tmp_path, 8, load_delay=30.0))
    await until(lambda: any("loading model" in line for line in supervisor.logs(8)), timeout=20)
    info = supervisor.info(8)
    assert info is not None and info.pid is not None and not info.ready
    supervisor.kill(8, "not needed any more")
    _, exited = await rec.wait_for(Exit, 8)
    assert exited.during_load and exited.reason == "stopped: not needed any more"
    assert exited.returncode is not None
    assert not alive(info.pid)
    assert rec.of(8) == [exited]


async def test_kill_right_after_spawn_never_starts_the_process(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    records = tmp_path / "records"
    supervisor.spawn(sim_spec(tmp_path, 13, record_dir=records))
    supervisor.kill(13, "changed my mind")
    _, exited = await rec.wait_for(Exit, 13)
    assert exited == Exit(13, "stopped: changed my mind", None, True, True)
    info = supervisor.info(13)
    assert info is not None and info.pid is None and info.exited
    # A replica spawned after it starts and loads: had the first been started late, its record would
    # be there too by then.
    supervisor.spawn(sim_spec(tmp_path, 14, record_dir=records, load_delay=0.0))
    await rec.wait_for(ReplicaReady, 14)
    later = supervisor.info(14)
    assert later is not None and [r["pid"] for r in read_records(records)] == [later.pid]


async def test_kill_unknown_or_dead_replica_is_a_no_op(
    sup: tuple[Supervisor, Recorder], tmp_path: Path
) -> None:
    supervisor, rec = sup
    supervisor.kill(12345, "nobody")
    supervisor.spawn(sim_spec(tmp_path, 9, exit_at_load=1, load_delay=0.0))
    await rec.wait_for(Exit, 9)
    supervisor.kill(9, "too late")
    # Reports come in order: once a replica spawned after the kill has come and gone, a report the kill
    # caused would be in.
    supervisor.spawn(sim_spec(tmp_path, 14, exit_at_load=1, load_delay=0.0))
    await rec.wait_for(Exit, 14)
    [exited] = rec.of(9)
    assert isinstance(exited, Exit) and "too late" not in exited.reason
    assert rec.of(12345) == []


async def test_ring_buffer_keeps_the_last_lines_of_both_streams(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    rec = Recorder()
    supervisor = rec.supervisor = Supervisor(rec, log_lines=5)
    await nursery.start(supervisor.run)
    script = (
        "import sys\n"
        "for i in range(40):\n"
        "    print('line', i, file=sys.stderr if i % 2 else sys.stdout, flush=True)\n"
    )
    port = free_port()
    supervisor.spawn(LaunchSpec(10, "chatty", (sys.executable, "-c", script), {}, port, 20.0, 5.0))
    _, exited = await rec.wait_for(Exit, 10)
    assert supervisor.logs(10) == [f"line {i}" for i in range(35, 40)]
    assert exited.returncode == 0 and exited.during_load
    assert "exit code 0" in exited.reason and "line 39" in exited.reason
    await supervisor.aclose()


async def test_spawn_failure_names_binary_and_error(sup: tuple[Supervisor, Recorder], tmp_path: Path) -> None:
    supervisor, rec = sup
    missing = tmp_path / "no-such-llama-server"
    supervisor.spawn(LaunchSpec(11, "ghost", (str(missing), "-m", "x.gguf"), {}, free_port(), 5.0, 1.0))
    _, exited = await rec.wait_for(Exit, 11)
    assert exited.returncode is None and exited.during_load and not exited.asked
    assert str(missing) in exited.reason and "No such file" in exited.reason

    not_executable = tmp_path / "plain-file"
    not_executable.write_text("not a program")
    supervisor.spawn(LaunchSpec(12, "ghost", (str(not_executable),), {}, free_port(), 5.0, 1.0))
    _, exited = await rec.wait_for(Exit, 12)
    assert exited.returncode is None and "Permission denied" in exited.reason


async def test_cancelling_run_kills_children(tmp_path: Path) -> None:
    rec = Recorder()
    supervisor = rec.supervisor = Supervisor(rec)
    pids: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.spawn(sim_spec(tmp_path, 20, load_delay=0.0))
        supervisor.spawn(sim_spec(tmp_path, 21, load_delay=0.0, ignore_sigterm=True, stop_timeout=1.0))
        supervisor.spawn(sim_spec(tmp_path, 22, load_delay=60.0))
        for replica_id in (20, 21):
            await rec.wait_for(ReplicaReady, replica_id)
        for replica_id in (20, 21, 22):
            info = supervisor.info(replica_id)
            assert info is not None and info.pid is not None
            pids.append(info.pid)
        assert all(alive(pid) for pid in pids)
        nursery.cancel_scope.cancel()
    assert not any(alive(pid) for pid in pids)
    for replica_id in (20, 21, 22):
        [exited] = [e for e in rec.of(replica_id) if isinstance(e, Exit)]
        assert exited.reason == "stopped: supervisor shutting down"
    assert [e.during_load for e in (rec.of(20)[-1], rec.of(21)[-1], rec.of(22)[-1])] == [False, False, True]


PARENT_SCRIPT = textwrap.dedent(
    """
    import sys
    import trio
    from router.shell.processes import LaunchSpec
    from statemachine.events import ReplicaReady
    from router.shell.supervisor import Supervisor

    async def main():
        ready = trio.Event()
        sup = Supervisor(lambda e: ready.set() if isinstance(e, ReplicaReady) else None)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            sup.spawn(LaunchSpec(1, "m", tuple(sys.argv[2:]), {}, int(sys.argv[1]), 20.0, 5.0))
            await ready.wait()
            print(sup.info(1).pid, flush=True)
            await trio.sleep_forever()

    trio.run(main)
    """
)


@pytest.mark.skipif(not LINUX, reason="the parent-death signal is Linux-only")
async def test_sigkilled_parent_leaves_no_child(tmp_path: Path) -> None:
    spec = sim_spec(tmp_path, 1, load_delay=0.0)
    parent = await trio.lowlevel.open_process(
        [sys.executable, "-c", PARENT_SCRIPT, str(spec.port), *spec.argv],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    child: int | None = None
    try:
        assert parent.stdout is not None
        with trio.fail_after(20):
            out = b""
            while not out.endswith(b"\n"):
                chunk = await parent.stdout.receive_some(100)
                assert chunk, "parent script ended before printing the child's pid"
                out += chunk
        child = int(out)
        assert alive(child)
        parent.kill()
        await parent.wait()
        await until(lambda: not alive(child), timeout=5, what="the orphaned child gone")
    finally:
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)  # the test failed; do not leave the orphan behind
        if parent.returncode is None:
            parent.kill()
            await parent.wait()


def test_line_splitter_handles_partial_crlf_long_and_invalid_input() -> None:
    splitter = LineSplitter(max_line=8)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\r\nde\n\xff\n") == ["abc", "de", "\ufffd"]
    assert splitter.feed(b"0123456789") == ["01234567"]
    assert splitter.flush() == ["89"]
    assert splitter.flush() == []


def test_telling_lines_put_out_of_memory_first() -> None:
    noise = [f"load_tensors: layer {i} assigned" for i in range(20)]
    oom = (
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB: cudaMalloc failed: out of memory"
    )
    failures = [f"step {i}: failed to load model" for i in range(10)]
    picked = telling_lines([*noise, oom, *failures, "main: exiting"], most=3)
    assert picked == [oom, "step 8: failed to load model", "step 9: failed to load model"]
    assert telling_lines([*noise, "", "  "], tail=2) == noise[-2:]
    assert telling_lines([]) == []
