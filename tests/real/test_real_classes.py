"""Who is served first, against the real llama-server on a tiny generated model: a request that comes after
queued batch work is served before it, and the batch work keeps its arrival order; two keys take turns, and a
key past its max_queued is refused at once while its queued work goes on.

Every claim is read from the arrival times of streamed tokens, never from sleeps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from statemachine import State
from tests.support.client import SseEvent, StreamResult, stream
from tests.support.harness import serving
from tests.support.realharness import long_body, real_document, real_router

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"
BATCH = {"x-router-class": "batch"}


async def test_a_later_standard_request_goes_before_queued_batch_work(tmp_path: Path) -> None:
    async with real_router(tmp_path, {"a": {"parallel": 1, "ctx": 4096}}) as rt:
        results: dict[str, StreamResult] = {}
        started = trio.Event()

        async def run(name: str, tokens: int, headers: dict[str, str] | None = None) -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    started.set()

            results[name] = await stream(
                rt.client, CHAT, long_body("a", tokens), on_event=seen, headers=headers
            )
            started.set()  # an error reply must not leave the test waiting

        def waiting(state: State) -> list[str]:
            """The classes of the waiting requests, in arrival order."""
            queued = sorted((r for r in state.requests.values() if r.phase == "queued"), key=lambda r: r.seq)
            return [r.klass.label for r in queued]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "long", 1800)  # long enough to still run while four more queue
            await started.wait()
            for index in range(3):
                nursery.start_soon(run, f"batch{index}", 6, BATCH)
                await rt.wait_state(lambda s, n=index + 1: len(waiting(s)) == n)  # in before the next
            nursery.start_soon(run, "person", 6)
            state = await rt.wait_state(lambda s: len(waiting(s)) == 4)
            assert waiting(state) == ["batch", "batch", "batch", "standard"]
        for name, result in results.items():
            assert result.status == 200 and result.done, (name, result.body[:300])
        person = results["person"]
        batches = [results[f"batch{i}"] for i in range(3)]
        assert results["long"].last_token_at < person.first_token_at
        for batch in batches:
            assert person.last_token_at < batch.first_token_at, "batch work went before the later request"
        firsts = [b.first_token_at for b in batches]
        assert firsts == sorted(firsts), "batch requests left their arrival order"


async def test_keys_take_turns_and_one_past_its_max_queued_is_refused_at_once(tmp_path: Path) -> None:
    doc = real_document(tmp_path, {"a": {"parallel": 1, "ctx": 4096}})
    doc["keys"] = {
        "agent": {"key": "sk-agent-1234", "max_queued": 3},
        "person": {"key": "sk-person-5678"},
    }
    agent, person = {"Authorization": "Bearer sk-agent-1234"}, {"Authorization": "Bearer sk-person-5678"}
    async with serving(tmp_path, doc, client_timeout=120.0) as rt:
        results: dict[str, StreamResult] = {}
        started = trio.Event()

        async def run(name: str, tokens: int, headers: dict[str, str]) -> None:
            def seen(event: SseEvent) -> None:
                if event.data:
                    started.set()

            results[name] = await stream(
                rt.client, CHAT, long_body("a", tokens), on_event=seen, headers=headers
            )
            started.set()

        def waiting(state: State) -> list[str]:
            queued = sorted((r for r in state.requests.values() if r.phase == "queued"), key=lambda r: r.seq)
            return [r.key for r in queued]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "long", 600, agent)
            await started.wait()
            for index in range(3):
                nursery.start_soon(run, f"agent{index}", 6, agent)
                await rt.wait_state(lambda s, n=index + 1: len(waiting(s)) == n)
            refused = await rt.client.post(CHAT, json=long_body("a", 6), headers=agent)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "key_queue_full"
            assert refused.headers["retry-after"]
            for index in range(2):
                nursery.start_soon(run, f"person{index}", 6, person)
                await rt.wait_state(lambda s, n=index + 4: len(waiting(s)) == n)
        for name, result in results.items():
            assert result.status == 200 and result.done, (name, result.body[:300])
        order = sorted(
            (name for name in results if name != "long"), key=lambda name: results[name].first_token_at
        )
        # The agent had its turn (the long request); the person's arrive later but the keys alternate,
        # each key's requests in arrival order.
        assert order == ["person0", "agent0", "person1", "agent1", "agent2"], order
