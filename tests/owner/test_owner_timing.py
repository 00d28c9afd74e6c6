"""Deadlines the owner task keeps on the Trio clock (idle ttl, shutdown grace), and the GPU memory check
before every spawn. The clock is pytest-trio's autojump MockClock: minutes pass in milliseconds."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from router.placement.readings import GpuReading, ProcessUse
from router.placement.synthetic import SyntheticModel
from statemachine import RejectCode
from tests.support.fake_supervisor import FakeGpus, KillCall, ask, owned_router, settle
from tests.support.simtools import placed_sim_model

MIB = 1 << 20
SMALL = SyntheticModel(
    n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_vocab=1024, n_ctx_train=8192
)


async def test_an_idle_replica_is_stopped_exactly_when_its_ttl_runs_out(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {"ttl": 600}}, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = ask(router, "a")
        await trio.sleep(2.5)  # loading takes a while
        sup.ready(1)
        await ticket.decided.wait()
        await trio.sleep(40.0)  # the reply streams for 40 s
        ticket.end(completed=True)
        await settle()
        done = trio.current_time()
        assert done == 42.5 and not sup.kills
        await trio.sleep(599.0)
        assert not sup.kills
        await trio.sleep(1.0)
        await settle()
        # An idle replica saves its slots first; its model keeps its prompt caches by default.
        assert sup.kills == [KillCall(1, "idle for 600 s (ttl)", done + 600.0, save=True)]
        sup.exit_killed()
        await settle()
        assert not router.state.replicas


async def test_a_request_before_the_ttl_moves_the_deadline(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {"ttl": 60}}, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        first = ask(router, "a")
        await settle()
        sup.ready(1)
        await first.decided.wait()
        first.end(completed=True)
        await trio.sleep(50.0)
        second = ask(router, "a")
        await second.decided.wait()
        second.end(completed=True)
        await trio.sleep(200.0)
        assert [(k.replica, k.at) for k in sup.kills] == [(1, 110.0)]


async def test_shutdown_stops_a_busy_replica_at_the_end_of_the_grace(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(
        tmp_path, {"a": {}, "b": {"gpus": [1]}}, launcher=launcher, devices={0: {}, 1: {}}
    ) as owned:
        router, sup = owned.router, owned.supervisor
        busy, idle = ask(router, "a"), ask(router, "b")
        await settle()
        sup.ready(1)
        sup.ready(2)
        await busy.decided.wait()
        await idle.decided.wait()
        idle.end(completed=True)
        await trio.sleep(3.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(router.shutdown, 30.0)
            await settle()
            idle_stop = (2, "router shutting down", 3.0, True)  # idle: its slots are saved first
            assert [(k.replica, k.reason, k.at, k.save) for k in sup.kills] == [idle_stop]
            await trio.sleep(60.0)
            assert sup.kills[1:] == [KillCall(1, "router shutdown deadline reached", 33.0)]
            assert busy.rejection is None  # the exit ends it
            sup.exit_killed()
        assert router.stopped.is_set()
        assert busy.rejection is not None and busy.rejection.code == "replica_exited"


async def test_memory_taken_by_others_refuses_the_load_before_any_process_starts(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    total = 4096 * MIB
    gpus = FakeGpus({0: GpuReading(0, total=total, used=100 * MIB, name="Fake 4GB", processes=())})
    model = placed_sim_model(tmp_path / "gguf", "small", SMALL)
    async with owned_router(tmp_path, {"small": {"model": model}}, launcher=launcher, gpus=gpus) as owned:
        router, sup = owned.router, owned.supervisor
        need = router.state.settings.models["small"].need_on(0)
        assert need > 0
        # A game starts on the GPU after planning and holds all but a few MiB.
        game = total - 100 * MIB - 4 * MIB
        gpus.readings[0] = GpuReading(
            0, total=total, used=total - 4 * MIB, name="Fake 4GB", processes=(ProcessUse(31337, game),)
        )
        ticket = ask(router, "small")
        await ticket.decided.wait()
        assert not sup.spawns  # no process was started into an out-of-memory
        assert ticket.reject is not None and ticket.reject.code is RejectCode.LOAD_FAILED
        assert "not enough GPU memory to start small" in ticket.reject.message
        assert "pid 31337" in ticket.reject.message
        # The scheduler stops the replica it planned; the supervisor has no process to stop.
        assert [h.kind for h in router.happenings] == ["load_refused", "stop"]
        assert [k.replica for k in sup.kills] == [1] and not sup.processes
        ticket.end(completed=False)
        await settle()
        assert not router.state.replicas and not router.tickets
        # The game ends: the next request loads.
        gpus.readings[0] = GpuReading(0, total=total, used=100 * MIB, name="Fake 4GB", processes=())
        again = ask(router, "small")
        await settle()
        assert [s.model for s in sup.spawns] == ["small"]
        sup.ready(sup.spawns[0].replica_id)
        await again.decided.wait()
        assert again.dispatch is not None
