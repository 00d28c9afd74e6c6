"""What Router.feed lets through to the scheduler, and what a strict router does with a refused event."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from statemachine import (
    ClientGone,
    DispatchFailed,
    IllegalEvent,
    ReplicaReady,
    RequestFinished,
    Tick,
    step,
)
from tests.support.fake_supervisor import ask, dispatched, owned_router, settle

MODELS = {"a": {}}


async def test_a_request_loads_a_replica_and_is_dispatched_to_its_port(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = ask(router, "a")
        await settle()
        assert [(s.replica_id, s.model) for s in sup.spawns] == [(1, "a")]
        assert not ticket.decided.is_set()
        sup.ready(1)
        await ticket.decided.wait()
        assert ticket.dispatch is not None and ticket.dispatch.replica == 1
        assert ticket.port == sup.spawns[0].port == router.ready_port(["a"])
        ticket.end(completed=True)
        await settle()
        assert not router.state.requests and not router.tickets
        assert [h.kind for h in router.happenings] == ["load", "ready"]


async def test_a_stale_tick_is_dropped(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router = owned.router
        await trio.sleep(5)
        ask(router, "a")
        await settle()
        state = router.state
        assert state.now == 5.0
        # The scheduler refuses time going backwards; a Tick that waited in the channel is only late.
        with pytest.raises(IllegalEvent):
            step(state, Tick(4.0))
        router.feed(Tick(4.0))
        router.feed(Tick(5.0))
        assert router.state is state


@pytest.mark.parametrize("late", [ClientGone, RequestFinished, DispatchFailed])
async def test_handler_events_for_a_request_the_scheduler_let_go_are_dropped(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock, late: type
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned)
        sup.exit(1, returncode=-9)  # the replica crashed with the request in flight
        await settle()
        assert ticket.rid not in router.state.requests
        assert ticket.rejection is not None and ticket.rejection.code == "replica_exited"
        event = DispatchFailed(ticket.rid, "refused") if late is DispatchFailed else late(ticket.rid)
        with pytest.raises(IllegalEvent):
            step(router.state, event)
        state = router.state
        router.feed(event)  # strict: would raise had it reached the scheduler
        assert router.state is state
        if late is not DispatchFailed:
            assert ticket.rid not in router.tickets  # the handler's last word: the ticket is forgotten


async def test_strict_mode_raises_what_the_scheduler_refuses(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        with pytest.raises(IllegalEvent, match="ReplicaReady for replica 7"):
            owned.router.feed(ReplicaReady(7))
    # From the owner task, the refusal ends the router's run.
    with pytest.RaisesGroup(IllegalEvent, flatten_subgroups=True):
        async with owned_router(tmp_path / "run", MODELS, launcher=launcher) as owned:
            owned.router.submit(ReplicaReady(7))
            await trio.sleep_forever()


async def test_production_mode_logs_the_refusal_and_goes_on(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher, strict=False) as owned:
        router = owned.router
        state = router.state
        with caplog.at_level(logging.ERROR, logger="router"):
            router.submit(ReplicaReady(7))
            await settle()
        assert router.state is state
        assert "scheduler refused an event: ReplicaReady for replica 7" in caplog.text
        ticket = await dispatched(owned)  # and it still serves
        assert ticket.dispatch is not None
