"""Tickets against replicas that change under them: a client that leaves, a replica that exits, a replica
that refuses the connection. The router is strict: any event the scheduler refuses fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from router.shell.ticket import TicketPhase
from statemachine import RejectCode
from tests.support.fake_supervisor import ask, dispatched, owned_router, settle

MODELS = {"a": {}}


async def test_a_client_that_leaves_while_its_replica_loads_is_forgotten_and_stops_the_load(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = ask(router, "a")
        await settle()
        assert len(sup.spawns) == 1 and router.state.requests[ticket.rid].phase == "queued"
        ticket.end(completed=False)
        await settle()
        assert not router.state.requests and not router.tickets
        assert [k.replica for k in sup.kills] == [1]  # nothing else needs the load: it stops
        assert ticket.dispatch is None and not ticket.decided.is_set()
        assert [r.phase for r in router.state.replicas] == ["stopping"]
        sup.exit(1)
        await settle()
        later = ask(router, "a")
        await settle()
        assert len(sup.spawns) == 2
        sup.ready(2)
        await later.decided.wait()
        assert later.dispatch is not None and later.dispatch.replica == 2


async def test_a_replica_ready_as_its_client_leaves_sends_it_nothing_and_frees_the_slot(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The replica's readiness reaches the owner task before the client's end: the scheduler dispatches a
    request whose handler has ended it. The ticket takes the dispatch without waking anyone, and the end, on
    its way, frees the slot for the next request."""
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = ask(router, "a")
        await settle()
        sup.ready(1)  # ReplicaReady is on the owner's channel ...
        ticket.end(completed=False)  # ... before ClientGone
        await settle()
        assert ticket.phase is TicketPhase.FINISHED and not ticket.decided.is_set()
        assert not router.state.requests and not router.tickets
        later = ask(router, "a")
        await later.decided.wait()
        assert later.dispatch is not None and later.dispatch.replica == 1


async def test_a_client_that_leaves_while_the_load_fails_gets_no_reply(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = ask(router, "a")
        await settle()
        ticket.end(completed=False)
        sup.load_failed(1, "no /health within 20 s")  # reported before the owner saw the client leave
        await settle()
        assert [k.replica for k in sup.kills] == [1]
        sup.exit(1)
        await settle()
        assert ticket.reject is None and not ticket.decided.is_set()
        assert not router.state.requests and not router.tickets and not router.state.replicas


async def test_a_replica_that_exits_under_a_request_fails_it_after_dispatch(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned)
        dispatch = ticket.dispatch
        sup.exit(1, returncode=-11)
        await settle()
        # Already dispatched: the reply is under way, so the refusal is a failure, not a reject.
        assert ticket.reject is None and ticket.dispatch is dispatch
        assert ticket.rejection is not None and ticket.rejection.code is RejectCode.REPLICA_EXITED
        assert (
            ticket.phase is TicketPhase.REJECTED and ticket.rid in router.tickets
        )  # until its handler is done
        ticket.end(completed=False)
        await settle()
        assert not router.tickets and not router.state.requests
        assert [h.kind for h in router.happenings][-1] == "exited"


async def test_a_handler_finishing_as_its_replica_exits_is_let_go_once(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned)
        # Both reach the channel before the owner runs: the exit first, then the handler's RequestFinished.
        sup.exit(1, returncode=1)
        ticket.end(completed=True)
        await settle()
        assert ticket.rejection is not None and ticket.rejection.code == "replica_exited"
        assert not router.tickets and not router.state.requests


async def test_a_refused_connection_sends_the_request_to_another_replica(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned)
        first = ticket.decided
        assert ticket.refused("connection refused")
        assert ticket.dispatch is None and ticket.port is None and ticket.decided is not first
        await settle()
        # The refusing replica takes no more work and is stopped; the request waits for a new one.
        assert [(k.replica, k.reason) for k in sup.kills] == [(1, "unloaded")]
        assert router.state.requests[ticket.rid].phase == "queued"
        assert [s.replica_id for s in sup.spawns] == [1, 2]
        assert not ticket.decided.is_set()
        sup.exit(1)
        sup.ready(2)
        await ticket.decided.wait()
        assert ticket.dispatch is not None and ticket.dispatch.replica == 2
        assert ticket.port == sup.spawns[1].port
        ticket.end(completed=True)
        await settle()
        assert not router.tickets and not router.state.requests


async def test_a_redispatch_after_the_replica_exited_gets_the_exit_as_its_answer(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned)
        # The connection was refused because the process was already gone; its exit is reported first.
        sup.exit(1, returncode=-9)
        assert ticket.refused("connection refused")
        await ticket.decided.wait()
        assert ticket.dispatch is None
        assert ticket.reject is not None and ticket.reject.code is RejectCode.REPLICA_EXITED
        ticket.end(completed=False)
        await settle()
        assert not router.tickets and not router.state.requests
        assert [s.replica_id for s in sup.spawns] == [1]  # the DispatchFailed never reached the scheduler


async def test_a_client_gone_in_flight_frees_the_slot_and_a_second_finish_changes_nothing(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        records: list[object] = []
        router.record_listeners.append(records.append)
        first, second = ask(router, "a"), ask(router, "a")
        await settle()
        sup.ready(1)
        await first.decided.wait()
        assert first.phase is TicketPhase.SENT and second.phase is TicketPhase.WAITING
        first.end(completed=False)  # the handler closed the exchange, then reports
        first.end(completed=True)
        await second.decided.wait()
        await settle()
        assert second.dispatch is not None and second.dispatch.replica == 1  # the slot went on at once
        assert first.phase is TicketPhase.FINISHED and first.rid not in router.tickets
        assert len(records) == 1 and first.rid not in router.state.requests
        assert [k.replica for k in sup.kills] == []


@pytest.mark.parametrize("refused_first", [False, True], ids=["exit seen first", "refusal sent first"])
async def test_a_request_whose_replica_exited_before_taking_it_is_admitted_again(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock, refused_first: bool
) -> None:
    """The proxy's connection is refused and the scheduler ends the request for the replica's exit, in either
    order: nothing reached the replica, so the ticket admits it again and the next replica serves it."""
    async with owned_router(tmp_path, MODELS, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned)
        sup.exit(1, returncode=-9)
        if refused_first:
            assert ticket.refused("connection refused")
            await ticket.decided.wait()
            assert ticket.reject is not None and ticket.reject.code == "replica_exited"
        else:
            await settle()
            assert ticket.rejection is not None and ticket.rejection.code == "replica_exited"
        assert ticket.refused("connection refused", again=True)
        assert ticket.rejection is None and ticket.dispatch is None and not ticket.decided.is_set()
        await settle()
        assert [s.replica_id for s in sup.spawns] == [1, 2]
        sup.ready(2)
        await ticket.decided.wait()
        assert ticket.dispatch is not None and ticket.dispatch.replica == 2 and ticket.reject is None
        ticket.end(completed=True)
        await settle()
        assert not router.tickets and not router.state.requests
