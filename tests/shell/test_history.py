"""The request history: one row per request, failures included, written off the event loop to SQLite, and
never in the way of a request when the database cannot be written."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from router.journal.history import History, HistoryQuery
from router.journal.records import RequestRecord
from tests.shell.test_metrics import parse, scrape, value
from tests.support.client import chat_body, stream
from tests.support.harness import running_router
from tests.support.waiting import until

CHAT = "/v1/chat/completions"


async def history(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    response = await client.get("/history", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def wait_rows(client: httpx.AsyncClient, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The newest rows once there are ``count`` (a stream's row lands when the router sees it end)."""

    async def rows() -> list[dict[str, Any]] | None:
        got = (await history(client, limit=100))["rows"]
        return list(reversed(got)) if len(got) >= count else None  # oldest first, as they were sent

    return await until(rows, timeout=timeout, what=f"{count} history rows")


def final_usage(events: list[Any], key: str = "usage") -> dict[str, Any]:
    for event in reversed(events):
        if event.data and f'"{key}"' in event.data:
            doc = event.json()
            return dict(doc.get(key) or doc["response"][key])
    raise AssertionError("no usage in the stream")


async def test_rows_match_the_requests_sent_including_failures(tmp_path: Path) -> None:
    models = {
        "alpha": {"aliases": ["a"], "sim": {"tokens": 5}},
        "long": {"sim": {"tokens": 500, "token_rate": 50.0}},
        "bad": {"sim": {"oom_at_load": True}},
    }
    async with running_router(tmp_path, models) as h:
        sent: list[dict[str, Any]] = []
        reply = await h.client.post(CHAT, json=chat_body("a", "hello from the alias"))
        assert reply.status_code == 200
        usage = reply.json()["usage"]
        sent.append(dict(endpoint=CHAT, status=200, asked="a", served="alpha", stream=False, usage=usage))

        streamed = await stream(h.client, CHAT, chat_body("alpha", "stream it"))
        assert streamed.done
        usage = final_usage(streamed.events)
        sent.append(dict(endpoint=CHAT, status=200, asked="alpha", served="alpha", stream=True, usage=usage))

        messages = {"model": "alpha", "max_tokens": 9, "messages": [{"role": "user", "content": "hi there"}]}
        reply = await h.client.post("/v1/messages", json=messages)
        assert reply.status_code == 200
        u = reply.json()["usage"]
        usage = {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"]}
        sent.append(
            dict(
                endpoint="/v1/messages", status=200, asked="alpha", served="alpha", stream=False, usage=usage
            )
        )

        streamed = await stream(h.client, "/v1/responses", {"model": "alpha", "input": "one two three four"})
        assert streamed.status == 200
        u = final_usage(streamed.events)
        usage = {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"]}
        sent.append(
            dict(
                endpoint="/v1/responses", status=200, asked="alpha", served="alpha", stream=True, usage=usage
            )
        )

        missing = await h.client.post(CHAT, json=chat_body("no-such-model"))
        assert missing.status_code == 404
        sent.append(dict(endpoint=CHAT, status=404, asked=None, served=None, stream=False, usage=None))

        failed = await h.client.post(CHAT, json=chat_body("bad"))
        assert failed.status_code == 503
        sent.append(dict(endpoint=CHAT, status=503, asked="bad", served=None, stream=False, usage=None))

        left = await stream(h.client, CHAT, chat_body("long", "a long story"), drop_after=3)
        assert left.dropped
        sent.append(dict(endpoint=CHAT, status=499, asked="long", served="long", stream=True, usage=None))

        rows = await wait_rows(h.client, len(sent))
        errors = (await history(h.client, status="error"))["rows"]
        only_alpha = (await history(h.client, model="alpha"))["rows"]
        fours = (await history(h.client, status="4xx"))["rows"]
        two = (await history(h.client, limit=2))["rows"]
        bad_filter = await h.client.get("/history", params={"status": "bogus"})
        counts = (await history(h.client))["last_5_min"]
        db = h.config.router.history_db

    assert len(rows) == len(sent)
    for row, want in zip(rows, sent, strict=True):
        assert row["endpoint"] == want["endpoint"], row
        assert row["status"] == want["status"], row
        assert row["model_asked"] == want["asked"], row
        assert row["model_served"] == want["served"], row
        assert row["stream"] is want["stream"], row
        assert row["client"] == "127.0.0.1"
        assert row["duration"] >= 0
        if want["usage"] is not None:
            assert row["prompt_tokens"] == want["usage"]["prompt_tokens"], row
            assert row["generated_tokens"] == want["usage"]["completion_tokens"], row
            assert row["cached_tokens"] is not None
            assert row["queue_wait"] is not None and row["queue_wait"] <= row["duration"]
            assert row["error"] is None
        if want["stream"] and want["usage"] is not None:
            assert row["ttft"] is not None and row["queue_wait"] <= row["ttft"] <= row["duration"]
        if not want["stream"]:
            assert row["ttft"] is None
    missing_row, failed_row, left_row = rows[4], rows[5], rows[6]
    assert "no-such-model" in missing_row["error"]
    assert "failed to load" in failed_row["error"] and failed_row["queue_wait"] is None
    assert "closed the connection" in left_row["error"]
    assert left_row["ttft"] is not None and left_row["prompt_tokens"] is None  # it never reached the end
    assert rows[0]["at"] <= rows[1]["at"] <= rows[-1]["at"] <= time.time()

    assert [r["status"] for r in errors] == [499, 503, 404]
    assert {r["model_served"] for r in only_alpha} == {"alpha"} and len(only_alpha) == 4
    assert [r["status"] for r in fours] == [499, 404]
    assert [r["status"] for r in two] == [499, 503]
    assert bad_filter.status_code == 400
    assert counts == {"requests": 7, "errors": 3, "complete": 1}
    # The rows are in the database file (the last ones flushed when the router stopped).
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT endpoint, status FROM requests ORDER BY id").fetchall()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert stored == [(w["endpoint"], w["status"]) for w in sent]
    assert mode == "wal"


async def test_an_unwritable_database_loses_rows_but_no_request(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the database's directory should be\n")
    models = {"m": {"sim": {"tokens": 3}}}
    router = {"history_db": str(blocker / "history.db")}
    async with running_router(tmp_path, models, router=router) as h:
        for i in range(4):
            reply = await h.client.post(CHAT, json=chat_body("m", f"request {i}"))
            assert reply.status_code == 200, reply.text
        streamed = await stream(h.client, CHAT, chat_body("m"))
        assert streamed.status == 200 and streamed.done
        missing = await h.client.post(CHAT, json=chat_body("nope"))
        assert missing.status_code == 404

        async def six_lost() -> Any:
            samples = await scrape(h.client)
            return samples if value(samples, "llama_router_history_rows_lost_total") >= 6 else None

        samples = await until(six_lost)
        doc = await history(h.client)

    assert value(samples, "llama_router_history_rows_lost_total") == 6
    assert value(samples, "llama_router_history_rows_written_total") == 0
    assert value(samples, "llama_router_requests_total", model="m", endpoint=CHAT, status="200") == 5
    assert doc["lost"] == 6 and doc["source"] == "memory" and "not-a-directory" in doc["last_error"]
    assert [r["status"] for r in doc["rows"]] == [404, 200, 200, 200, 200, 200]
    assert not (blocker / "history.db").exists()


def record(at: float, status: int = 200, model: str = "m") -> RequestRecord:
    return RequestRecord(
        at=at, client="c", endpoint=CHAT, model_asked=model, model_served=model, status=status, duration=0.1
    )


async def test_retention_prunes_by_age_and_by_count(tmp_path: Path) -> None:
    store = History(tmp_path / "deep" / "h.db", max_rows=5, max_age_days=1.0)
    now = time.time()
    for i in range(2):
        store.add(record(now - 3 * 86400 + i))  # three days old
    for i in range(6):
        store.add(record(now - 60 + i, status=200 + i))
    await store.flush()
    assert store.written == 8 and store.lost == 0
    await store.prune()
    rows, source = await store.query(HistoryQuery(limit=100))
    assert source == "db"
    assert [r["status"] for r in rows] == [205, 204, 203, 202, 201]
    assert all(r["at"] > now - 86400 for r in rows)
    assert store.pruned == 3


async def test_a_full_buffer_drops_and_counts_instead_of_growing(tmp_path: Path) -> None:
    store = History(tmp_path / "h.db", max_rows=100, max_age_days=1.0, buffer_rows=3)
    for i in range(5):
        store.add(record(time.time(), status=200 + i))
    assert store.pending == 3 and store.lost == 2
    await store.flush()
    assert store.written == 3 and store.pending == 0
    rows, _ = await store.query(HistoryQuery(status="2xx"))
    assert [r["status"] for r in rows] == [202, 201, 200]


async def test_the_writer_keeps_going_after_the_database_breaks(tmp_path: Path) -> None:
    """A database that goes away mid-run loses the rows of that moment; later rows land once it is back."""
    path = tmp_path / "dir" / "h.db"
    store = History(path, max_rows=100, max_age_days=1.0)
    store.add(record(time.time(), status=201))
    await store.flush()
    assert store.written == 1
    await trio.to_thread.run_sync(store._store.close)
    (tmp_path / "dir").rename(tmp_path / "moved")
    (tmp_path / "dir").write_text("in the way\n")
    store.add(record(time.time(), status=202))
    await store.flush()
    assert store.lost == 1 and not store.healthy
    rows, source = await store.query(HistoryQuery())
    assert source == "memory" and [r["status"] for r in rows] == [202, 201]
    (tmp_path / "dir").unlink()
    (tmp_path / "moved").rename(tmp_path / "dir")
    store.add(record(time.time(), status=203))
    await store.flush()
    assert store.healthy and store.written == 2
    rows, source = await store.query(HistoryQuery())
    assert source == "db" and [r["status"] for r in rows] == [203, 201]


async def test_a_row_sqlite_cannot_take_is_lost_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A value SQLite refuses (an integer beyond 64 bits from a replica's usage, say) costs its batch, not the
    writer task: the rows after it are written by the same task."""
    store = History(tmp_path / "h.db", max_rows=100, max_age_days=1.0, flush_every=0.02)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.add(attrs.evolve(record(time.time(), status=201), prompt_tokens=2**70))
        await until(lambda: store.lost >= 1, timeout=5)
        store.add(record(time.time(), status=202))
        await until(lambda: store.written >= 1, timeout=5)
        nursery.cancel_scope.cancel()
    assert store.lost == 1 and store.written == 1
    rows, source = await store.query(HistoryQuery())
    assert source == "db" and [r["status"] for r in rows] == [202]


def test_bad_status_filters_are_refused() -> None:
    from router.journal.history import status_range

    assert status_range("5xx") == (500, 599)
    assert status_range("error") == (400, 999)
    assert status_range(None) is None
    with pytest.raises(ValueError):
        status_range("bogus")


async def test_requests_refused_before_admission_are_recorded(tmp_path: Path) -> None:
    """No key, a body over the limit, bad JSON: the router answers them itself, and the history and the
    request counters still see them."""
    models = {"m": {"sim": {"tokens": 2}}}
    router = {"api_keys": ["secret"], "max_body_mib": 1}
    key = {"Authorization": "Bearer secret"}
    async with running_router(tmp_path, models, router=router) as h:
        assert (await h.client.post(CHAT, json=chat_body("m"))).status_code == 401
        big = {"model": "m", "prompt": "x" * (2 * 1024 * 1024)}
        assert (await h.client.post("/v1/completions", json=big, headers=key)).status_code == 413
        bad = await h.client.post(
            CHAT, content=b"{not json", headers={**key, "content-type": "application/json"}
        )
        assert bad.status_code == 400
        assert (await h.client.post(CHAT, json=chat_body("m"), headers=key)).status_code == 200
        assert (await h.client.get("/history")).status_code == 401
        rows = list(reversed((await h.client.get("/history", headers=key)).json()["rows"]))
        samples = parse((await h.client.get("/metrics", headers=key)).text)

    assert [(r["endpoint"], r["status"]) for r in rows] == [
        (CHAT, 401),
        ("/v1/completions", 413),
        (CHAT, 400),
        (CHAT, 200),
    ]
    assert "API key" in rows[0]["error"] and "max_body_mib" in rows[1]["error"]
    assert rows[0]["model_served"] is None and rows[3]["model_served"] == "m"
    assert value(samples, "llama_router_requests_total", model="", endpoint=CHAT, status="401") == 1
    assert (
        value(samples, "llama_router_requests_total", model="", endpoint="/v1/completions", status="413") == 1
    )
