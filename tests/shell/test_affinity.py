"""Prefix affinity through the real router and simulated upstreams: a conversation's later turns go back to
the replica that served its earlier ones, and with ``prefix_affinity = false`` to the least busy replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from router.http.prefix_key import prefix_chain
from router.shell.ticket import Ticket
from tests.support.harness import RouterHandle, running_router

MODELS = {"a": {"num_instance": 2, "parallel": 1, "load_on_startup": True, "sim": {"tokens": 20}}}
SYSTEM = "You answer questions about one long document. " * 60  # about 2.7 KiB


def body(topic: str, turn: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"{topic}: {SYSTEM}"}]
    for n in range(turn):
        messages.append({"role": "user", "content": f"{topic} question {n} " + "context " * 160})
        if n < turn - 1:
            messages.append({"role": "assistant", "content": f"{topic} answer {n} " + "reply " * 160})
    return {"model": "a", "messages": messages, "max_tokens": 20, "temperature": 0.2 * turn}


def spy(rt: RouterHandle) -> list[Ticket]:
    """Every ticket the router admits from now on (its dispatch names the replica that served it)."""
    tickets: list[Ticket] = []
    admit = rt.router.admit

    def recording(*args: Any, **kwargs: Any) -> Ticket:
        ticket = admit(*args, **kwargs)
        tickets.append(ticket)
        return ticket

    rt.router.admit = recording  # type: ignore[method-assign]
    return tickets


async def conversations(rt: RouterHandle) -> dict[str, list[int]]:
    """A and B start together (so they start on different replicas), then take turns one at a time: the
    replica that served each turn, by conversation."""
    await rt.wait_ready("a", 2)
    tickets = spy(rt)

    async def post(topic: str, turn: int) -> None:
        reply = await rt.client.post("/v1/chat/completions", json=body(topic, turn))
        assert reply.status_code == 200, reply.text

    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, "A", 1)
        await rt.wait_state(lambda s: any(r.inflight for r in s.replicas))
        nursery.start_soon(post, "B", 1)
    for turn in (2, 3, 4):
        for topic in ("B", "A"):  # B first: both replicas are idle, least busy would pick the first
            await post(topic, turn)
    served: dict[str, list[int]] = {"A": [], "B": []}
    for ticket, topic in zip(tickets, ["A", "B"] + ["B", "A"] * 3, strict=True):
        assert ticket.dispatch is not None
        served[topic].append(ticket.dispatch.replica)
    return served


async def test_each_conversation_stays_on_the_replica_it_started_on(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS) as rt:
        served = await conversations(rt)
        await rt.wait_idle()
        memories = {r.id: r.memory for r in rt.router.state.replicas}
    assert len(set(served["A"])) == 1 and len(set(served["B"])) == 1, served
    assert served["A"][0] != served["B"][0], served
    assert all(len(memory) == 1 and len(memory[0]) >= 4 for memory in memories.values()), memories


async def test_without_prefix_affinity_the_least_busy_replica_serves(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, router={"prefix_affinity": False, "affinity_guard": 3}) as rt:
        assert rt.router.state.settings.policy.affinity_guard == 3
        served = await conversations(rt)
        memories = {r.id: r.memory for r in rt.router.state.replicas}
    first = min(memories)
    assert served["B"][1:] == [first] * 3 and served["A"][1:] == [first] * 3, served
    assert all(memory == () for memory in memories.values())


async def test_the_chat_page_passes_the_chain_of_its_body(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS) as rt:
        await rt.wait_ready("a", 2)
        doc = body("A", 2)
        reply = await rt.client.post("/chat/a/v1/chat/completions", json=doc)
        assert reply.status_code == 200, reply.text
        await rt.wait_idle()
        memories = [r.memory for r in rt.router.state.replicas if r.memory]
    chain = prefix_chain(doc, "/v1/chat/completions")
    assert len(chain) >= 4 and memories == [(chain,)]
