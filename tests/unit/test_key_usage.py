"""Usage per key from the request history (router.journal.key_usage): the sums /usage answers, read from
SQLite or, while the database cannot be read, from the records kept in memory — the same either way — and
a database written before keys were recorded, which gains the column when it is opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from router.journal.history import _row, _Store
from router.journal.key_usage import UsageQuery, sum_records
from router.journal.records import RequestRecord

OLD_SCHEMA = """
CREATE TABLE requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, client TEXT NOT NULL, endpoint TEXT NOT NULL,
    model_asked TEXT, model_served TEXT, status INTEGER NOT NULL, duration REAL NOT NULL, queue_wait REAL,
    ttft REAL, prompt_tokens INTEGER, generated_tokens INTEGER, cached_tokens INTEGER, error TEXT,
    target TEXT, stream INTEGER NOT NULL DEFAULT 0
);
"""


def record(at: float, key: str, status: int = 200, served: str | None = "m", **more: object) -> RequestRecord:
    return RequestRecord(
        at=at,
        client="127.0.0.1",
        endpoint="/v1/chat/completions",
        model_asked="m",
        model_served=served,
        status=status,
        duration=2.0,
        key=key,
        **more,  # type: ignore[arg-type]
    )


RECORDS = [
    record(100.0, "alice", queue_wait=0.5, prompt_tokens=10, generated_tokens=5, cached_tokens=4),
    record(200.0, "alice", queue_wait=1.0, prompt_tokens=7, generated_tokens=3),
    record(300.0, "bob", status=429, served=None),
    record(400.0, "", queue_wait=0.25, prompt_tokens=1, generated_tokens=1),
]


def test_the_database_and_the_memory_sum_the_same(tmp_path: Path) -> None:
    store = _Store(tmp_path / "history.db")
    store.write([_row(r) for r in RECORDS])
    for query in (UsageQuery(), UsageQuery(since=150.0), UsageQuery(until=300.0), UsageQuery(key="alice")):
        assert store.usage(query) == sum_records(RECORDS, query), query
    alice = store.usage(UsageQuery())["alice"]
    assert alice == {
        "requests": 2,
        "errors": 0,
        "prompt_tokens": 17,
        "completion_tokens": 8,
        "cached_tokens": 4,
        "queue_seconds": 1.5,
        "replica_seconds": 2.5,  # 2 s each, less the waits
    }
    assert store.usage(UsageQuery())["bob"]["errors"] == 1
    assert store.usage(UsageQuery())["bob"]["replica_seconds"] == 0.0  # refused: no replica served it
    assert store.token_use(150.0) == [("alice", 202.0, 10)]  # named keys only, by when they ended
    store.close()


def test_a_history_written_before_keys_were_recorded_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute(
            "INSERT INTO requests (at, client, endpoint, status, duration) "
            "VALUES (1.0, 'x', '/v1/completions', 200, 1.0)"
        )
    conn.close()
    store = _Store(path)
    store.write([_row(RECORDS[0])])
    usage = store.usage(UsageQuery())
    assert usage[""]["requests"] == 1 and usage["alice"]["requests"] == 1
    store.close()
