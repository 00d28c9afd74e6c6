"""Usage per key, summed over the request history: what ``GET /usage`` answers and the dashboard shows.

For each key name ("" for anonymous and plain ``api_keys`` clients): requests, of which refused or failed
(status 400 and above), prompt, completion and cached tokens, seconds spent waiting in the queue, and
replica-seconds (from dispatch to the reply's end, for requests a replica or peer served).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

import attrs

from router.journal.records import RequestRecord


@attrs.frozen
class UsageQuery:
    """Rows with ``since <= at < until`` (None: unbounded), of one ``key`` (None: every key)."""

    since: float | None = None
    until: float | None = None
    key: str | None = None


FIELDS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "queue_seconds",
    "replica_seconds",
)

_SQL = """
SELECT key, COUNT(*), SUM(status >= 400), COALESCE(SUM(prompt_tokens), 0),
       COALESCE(SUM(generated_tokens), 0), COALESCE(SUM(cached_tokens), 0),
       COALESCE(SUM(queue_wait), 0.0),
       COALESCE(SUM(CASE WHEN model_served IS NOT NULL THEN duration - COALESCE(queue_wait, 0.0) END), 0.0)
FROM requests
"""


def _where(query: UsageQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if query.since is not None:
        clauses.append("at >= ?")
        args.append(query.since)
    if query.until is not None:
        clauses.append("at < ?")
        args.append(query.until)
    if query.key is not None:
        clauses.append("key = ?")
        args.append(query.key)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def read_usage(conn: sqlite3.Connection, query: UsageQuery) -> dict[str, dict[str, float]]:
    where, args = _where(query)
    rows = conn.execute(_SQL + where + " GROUP BY key ORDER BY key", args).fetchall()
    return {row[0]: _entry(row[1:]) for row in rows}


def read_token_use(conn: sqlite3.Connection, since: float) -> list[tuple[str, float, int]]:
    """(key, ended at, prompt + completion tokens) of named keys' requests that ended after ``since``."""
    rows = conn.execute(
        "SELECT key, at + duration, COALESCE(prompt_tokens, 0) + COALESCE(generated_tokens, 0) "
        "FROM requests WHERE key != '' AND at + duration > ? ORDER BY at + duration",
        (since,),
    ).fetchall()
    return [(str(k), float(at), int(n)) for k, at, n in rows if n]


def sum_records(records: Iterable[RequestRecord], query: UsageQuery) -> dict[str, dict[str, float]]:
    """The same sums over records kept in memory (while the database cannot be read)."""
    sums: dict[str, list[float]] = {}
    for r in records:
        if query.since is not None and r.at < query.since:
            continue
        if query.until is not None and r.at >= query.until:
            continue
        if query.key is not None and r.key != query.key:
            continue
        row = sums.setdefault(r.key, [0.0] * len(FIELDS))
        served = r.model_served is not None
        for i, value in enumerate(
            (
                1,
                r.status >= 400,
                r.prompt_tokens or 0,
                r.generated_tokens or 0,
                r.cached_tokens or 0,
                r.queue_wait or 0.0,
                r.duration - (r.queue_wait or 0.0) if served else 0.0,
            )
        ):
            row[i] += value
    return {key: _entry(sums[key]) for key in sorted(sums)}


def _entry(values: Iterable[Any]) -> dict[str, float]:
    entry: dict[str, float] = {}
    for name, value in zip(FIELDS, values, strict=True):
        entry[name] = round(float(value or 0), 3) if name.endswith("seconds") else int(value or 0)
    return entry
