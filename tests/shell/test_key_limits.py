"""A named key's own limits against the running router — requests_per_minute, tokens_per_day (which a
restart does not forgive) and max_queued, each answered 429 with Retry-After and OpenAI's x-ratelimit-*
headers while other keys go on — and usage per key on /usage, /metrics and in the history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from router.config.values import KeyConfig
from router.deploy.launch import key_queue_limits
from tests.shell.test_keys import ALICE, BOB, SLOW, as_key, chat
from tests.support.client import assert_openai_error
from tests.support.harness import RouterHandle, serving
from tests.support.simconfig import config_document
from tests.support.waiting import until


def document(tmp_path: Path, alice: dict[str, Any], models: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = config_document(tmp_path, models or {"chat": {"parallel": 4}})
    return {**doc, "keys": {"alice": {"key": ALICE, **alice}, "bob": {"key": BOB}}}


async def test_a_key_over_its_requests_per_minute_gets_429_and_another_key_does_not(tmp_path: Path) -> None:
    async with serving(tmp_path, document(tmp_path, {"requests_per_minute": 2})) as h:
        first, second = [await chat(h, ALICE, "chat") for _ in range(2)]
        assert (first.status_code, second.status_code) == (200, 200)
        # every answer says what is left: OpenAI's headers, as its SDKs read them
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert second.headers["x-ratelimit-remaining-requests"] == "0"
        assert second.headers["x-ratelimit-reset-requests"] in ("59s", "1m0s")
        refused = await chat(h, ALICE, "chat")
        error = assert_openai_error(refused, 429, "rate_limit_exceeded")
        assert error["type"] == "rate_limit_error"
        assert "requests_per_minute = 2" in error["message"] and "[keys.alice]" in error["message"], error
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.headers["x-ratelimit-limit-requests"] == "2"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
        bob = await chat(h, BOB, "chat")
        assert bob.status_code == 200 and "x-ratelimit-limit-requests" not in bob.headers  # bob has none
        rows = (await h.client.get("/history", headers=as_key(BOB))).json()["rows"]
        assert [(r["key"], r["status"]) for r in rows] == [
            ("bob", 200),
            ("alice", 429),
            *[("alice", 200)] * 2,
        ]


async def wait_spent(h: RouterHandle, key: str) -> None:
    """Until a finished request's tokens have counted against ``key`` (its record is published as its
    handler ends, just after the reply)."""
    await until(lambda: h.router.quotas.use[key].tokens, what=f"{key}'s tokens counted")


async def test_a_key_over_its_tokens_per_day_stays_refused_across_a_restart(tmp_path: Path) -> None:
    doc = document(tmp_path, {"tokens_per_day": 5})
    async with serving(tmp_path, doc) as h:
        assert (await chat(h, ALICE, "chat")).status_code == 200  # its prompt alone is more than 5 tokens
        await wait_spent(h, "alice")
        refused = await chat(h, ALICE, "chat")
        error = assert_openai_error(refused, 429, "rate_limit_exceeded")
        assert "tokens_per_day = 5" in error["message"], error
        assert refused.headers["x-ratelimit-limit-tokens"] == "5"
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
        assert 82_000 <= int(refused.headers["retry-after"]) <= 86_400  # until the tokens leave the day
        assert (await chat(h, BOB, "chat")).status_code == 200
    async with serving(tmp_path, doc) as h:  # the same history: the day's tokens still count
        assert_openai_error(await chat(h, ALICE, "chat"), 429, "rate_limit_exceeded")
        assert (await chat(h, BOB, "chat")).status_code == 200


async def test_a_key_with_max_queued_waiting_gets_429_and_its_running_work_goes_on(tmp_path: Path) -> None:
    doc = document(tmp_path, {"max_queued": 1}, {"chat": {"sim": SLOW}})
    async with serving(tmp_path, doc) as h:
        assert dict(h.router.state.settings.max_queued) == {"alice": 1, "bob": 500}  # half of queue_limit
        answers: list[int] = []

        async def send() -> None:
            answers.append((await chat(h, ALICE, "chat")).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)  # runs
            await h.wait_state(lambda s: any(r.phase == "inflight" for r in s.requests.values()))
            nursery.start_soon(send)  # waits
            await h.wait_state(lambda s: s.waiting == 1)
            refused = await chat(h, ALICE, "chat")
            error = assert_openai_error(refused, 429, "key_queue_full")
            assert "max_queued = 1" in error["message"] and error["type"] == "rate_limit_error", error
            assert refused.headers["retry-after"]
        assert answers == [200, 200]


def test_named_keys_without_max_queued_share_half_the_queue_each() -> None:
    alice, bob = KeyConfig("alice", "a", max_queued=3), KeyConfig("bob", "b")
    assert key_queue_limits({"alice": alice, "bob": bob}, 11) == {"alice": 3, "bob": 5}
    assert key_queue_limits({"bob": bob}, 11) == {}  # one named key alone: the queue's limit only
    assert key_queue_limits({"alice": alice}, 11) == {"alice": 3}


async def test_usage_per_key_on_usage_and_metrics(tmp_path: Path) -> None:
    async with serving(tmp_path, document(tmp_path, {})) as h:
        for key in (ALICE, ALICE, BOB):
            assert (await chat(h, key, "chat")).status_code == 200
        assert_openai_error(await chat(h, BOB, "nothing"), 404, "model_not_found")
        await h.wait_idle()
        doc = (await h.client.get("/usage", headers=as_key(BOB))).json()
        alice, bob = doc["keys"]["alice"], doc["keys"]["bob"]
        assert (alice["requests"], alice["errors"], bob["requests"], bob["errors"]) == (2, 0, 2, 1)
        assert alice["prompt_tokens"] > 0 and alice["completion_tokens"] == 4
        assert alice["replica_seconds"] > 0 and bob["queue_seconds"] >= 0
        only = (await h.client.get("/usage?key=alice&since=2026-01-01", headers=as_key(BOB))).json()
        assert list(only["keys"]) == ["alice"] and only["keys"]["alice"] == alice
        later = (await h.client.get("/usage?since=4102444800", headers=as_key(BOB))).json()
        assert later["keys"] == {}
        bad = await h.client.get("/usage?until=yesterday", headers=as_key(BOB))
        assert_openai_error(bad, 400, "invalid_filter")
        assert (await h.client.get("/usage")).status_code == 401
        metrics = (await h.client.get("/metrics", headers=as_key(BOB))).text
        assert 'llama_router_key_requests_total{key="alice",status="200"} 2.0' in metrics
        assert 'llama_router_key_tokens_total{key="alice",kind="completion"} 4.0' in metrics
