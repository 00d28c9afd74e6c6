"""The request history: one SQLite row per finished request, written off the event loop.

``History.add`` only appends to a bounded in-memory buffer and never blocks. One writer task flushes the
buffer in batches (every second, or sooner when a batch is full) on a worker thread; SQLite runs in WAL
mode, so the readers of ``/history`` do not wait for it. Rows older than ``max_age_days`` and rows beyond
``max_rows`` are pruned every minute.

A full disk, an unwritable path or a broken database never reaches a request: the rows that cannot be
written are dropped and counted in ``lost`` (exported as ``llama_router_history_rows_lost_total``), a
warning is logged at most once a minute, and the next flush tries to open the database again. While the
database is unusable, ``query`` answers from the most recent records kept in memory. Any other fault in a
batch (a value SQLite cannot bind, say) is handled the same way: the writer task never ends before the
router does.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from router.journal.key_usage import UsageQuery, read_token_use, read_usage, sum_records
from router.journal.records import RequestRecord

log = logging.getLogger("router")

FLUSH_EVERY = 1.0
BATCH_ROWS = 200
BUFFER_ROWS = 5000
RECENT_ROWS = 500
PRUNE_EVERY = 60.0
WARN_EVERY = 60.0
MAX_LIMIT = 1000
BUSY_TIMEOUT_MS = 2000

COLUMNS = tuple(a.name for a in attrs.fields(RequestRecord))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    client TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model_asked TEXT,
    model_served TEXT,
    status INTEGER NOT NULL,
    duration REAL NOT NULL,
    queue_wait REAL,
    ttft REAL,
    prompt_tokens INTEGER,
    generated_tokens INTEGER,
    cached_tokens INTEGER,
    error TEXT,
    target TEXT,
    stream INTEGER NOT NULL DEFAULT 0,
    key TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS requests_at ON requests (at);
"""
# Columns added since the first schema, with their definitions: a database written by an earlier version
# gets them when it is opened.
_ADDED = {"key": "TEXT NOT NULL DEFAULT ''"}


@attrs.frozen
class HistoryQuery:
    """A filter for ``History.query``: newest first, at most ``limit`` rows.

    ``model`` matches the asked name, the served model or the resolved target. ``status`` is a code
    ("404"), a class ("2xx", "4xx", "5xx"), "ok" (below 400) or "error" (400 and above).
    """

    limit: int = 100
    model: str | None = None
    status: str | None = None


def status_range(status: str | None) -> tuple[int, int] | None:
    """The inclusive status range a ``status`` filter stands for; None: no filter. Raises ValueError."""
    if status is None or status in ("", "all"):
        return None
    if status == "ok":
        return 0, 399
    if status == "error":
        return 400, 999
    if len(status) == 3 and status[0].isdigit() and status[1:] == "xx":
        base = int(status[0]) * 100
        return base, base + 99
    code = int(status)
    return code, code


def _matches(record: RequestRecord, query: HistoryQuery) -> bool:
    if query.model and query.model not in (record.model_asked, record.model_served, record.target):
        return False
    bounds = status_range(query.status)
    return bounds is None or bounds[0] <= record.status <= bounds[1]


def _row(record: RequestRecord) -> tuple[Any, ...]:
    return tuple(int(v) if isinstance(v, bool) else v for v in attrs.astuple(record))


def _add_columns(conn: sqlite3.Connection) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
    for name, definition in _ADDED.items():
        if name not in have:
            conn.execute(f"ALTER TABLE requests ADD COLUMN {name} {definition}")


class _Store:
    """The database side, used from worker threads only, one call at a time (guarded by a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.conn: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self.conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                _add_columns(conn)
            except BaseException:
                conn.close()
                raise
            self.conn = conn
        return self.conn

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        with self.lock:
            try:
                conn = self._open()
                with conn:
                    names = ", ".join(COLUMNS)
                    marks = ", ".join("?" for _ in COLUMNS)
                    conn.executemany(f"INSERT INTO requests ({names}) VALUES ({marks})", rows)
            except BaseException:
                self._drop()
                raise

    def prune(self, max_rows: int, oldest: float) -> int:
        with self.lock:
            try:
                conn = self._open()
                with conn:
                    gone = conn.execute("DELETE FROM requests WHERE at < ?", (oldest,)).rowcount
                    gone += conn.execute(
                        "DELETE FROM requests WHERE id <= "
                        "(SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?)",
                        (max_rows,),
                    ).rowcount
                return gone
            except BaseException:
                self._drop()
                raise

    def read(self, query: HistoryQuery) -> list[dict[str, Any]]:
        with self.lock:
            conn = self._open()
            where: list[str] = []
            args: list[Any] = []
            if query.model:
                where.append("(model_asked = ? OR model_served = ? OR target = ?)")
                args += [query.model] * 3
            bounds = status_range(query.status)
            if bounds is not None:
                where.append("status BETWEEN ? AND ?")
                args += list(bounds)
            sql = f"SELECT id, {', '.join(COLUMNS)} FROM requests"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " ORDER BY id DESC LIMIT ?"
            args.append(query.limit)
            cursor = conn.execute(sql, args)
            names = [d[0] for d in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            row["stream"] = bool(row["stream"])
        return rows

    def usage(self, query: UsageQuery) -> dict[str, dict[str, float]]:
        with self.lock:
            return read_usage(self._open(), query)

    def token_use(self, since: float) -> list[tuple[str, float, int]]:
        with self.lock:
            return read_token_use(self._open(), since)

    def _drop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
            self.conn = None


class History:
    """The request history of one router. Feed it with ``add``; run ``run`` in a nursery."""

    def __init__(
        self,
        path: Path,
        *,
        max_rows: int,
        max_age_days: float,
        buffer_rows: int = BUFFER_ROWS,
        batch_rows: int = BATCH_ROWS,
        flush_every: float = FLUSH_EVERY,
    ) -> None:
        self.path = Path(path)
        self.max_rows = max_rows
        self.max_age_days = max_age_days
        self.buffer_rows = buffer_rows
        self.batch_rows = batch_rows
        self.flush_every = flush_every
        self.written = 0
        self.lost = 0
        self.pruned = 0
        self.last_error: str | None = None
        self.recent: collections.deque[RequestRecord] = collections.deque(maxlen=RECENT_ROWS)
        self._buffer: collections.deque[RequestRecord] = collections.deque()
        self._store = _Store(self.path)
        self._flushing = trio.Lock()
        self._wake = trio.Event()
        self._last_prune = -math.inf
        self._last_warning = -math.inf
        self._healthy = True

    # ----------------------------------------------------------------------------------- event loop
    def add(self, record: RequestRecord) -> None:
        """Queue one record for writing; never blocks. A full buffer drops the record and counts it."""
        self.recent.append(record)
        if len(self._buffer) >= self.buffer_rows:
            self._lose(1, "the history buffer is full (the database is not keeping up)", broken=False)
            return
        self._buffer.append(record)
        if len(self._buffer) >= self.batch_rows:
            self._wake.set()

    def recent_counts(self, window: float = 300.0) -> dict[str, int]:
        """Requests and failed requests of the last ``window`` seconds among the records kept in memory
        (the newest RECENT_ROWS; ``complete`` is 0 when older ones of the window fell out)."""
        since = time.time() - window
        rows = [r for r in self.recent if r.at >= since]
        complete = len(rows) < len(self.recent) or len(self.recent) < RECENT_ROWS
        return {
            "requests": len(rows),
            "errors": sum(1 for r in rows if r.status >= 400),
            "complete": int(complete),
        }

    @property
    def pending(self) -> int:
        return len(self._buffer)

    @property
    def healthy(self) -> bool:
        """Whether the last write (or prune) reached the database."""
        return self._healthy

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                with trio.move_on_after(self.flush_every):
                    await self._wake.wait()
                self._wake = trio.Event()
                try:
                    await self.flush()
                    if trio.current_time() - self._last_prune >= PRUNE_EVERY:
                        await self.prune()
                except Exception:  # the history must never take the router down with it
                    log.exception("request history: the writer failed; carrying on")
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(5.0):
                    await self.flush()
                await trio.to_thread.run_sync(self._store.close)

    async def flush(self) -> None:
        """Write everything buffered so far (in batches); rows that cannot be written are counted lost."""
        async with self._flushing:
            while self._buffer:
                count = min(len(self._buffer), self.batch_rows)
                batch = [self._buffer.popleft() for _ in range(count)]
                try:
                    rows = [_row(r) for r in batch]
                    await trio.to_thread.run_sync(self._store.write, rows)
                except Exception as exc:  # sqlite3.Error, OSError, or a value SQLite cannot take
                    self._lose(len(batch), f"cannot write {self.path}: {exc!r}")
                else:
                    self.written += len(rows)
                    self._healthy = True

    async def prune(self) -> None:
        self._last_prune = trio.current_time()
        oldest = time.time() - self.max_age_days * 86400.0
        async with self._flushing:
            try:
                self.pruned += await trio.to_thread.run_sync(self._store.prune, self.max_rows, oldest)
            except Exception as exc:
                self._warn(f"cannot prune {self.path}: {exc}")

    async def query(self, query: HistoryQuery) -> tuple[list[dict[str, Any]], str]:
        """Rows matching ``query``, newest first, and where they came from ("db" or "memory")."""
        query = attrs.evolve(query, limit=max(1, min(query.limit, MAX_LIMIT)))
        status_range(query.status)  # raises ValueError on a bad filter before any I/O
        await self.flush()
        if self._healthy:
            try:
                return await trio.to_thread.run_sync(self._store.read, query), "db"
            except Exception as exc:
                self._warn(f"cannot read {self.path}: {exc}")
        rows = [r.as_json() for r in reversed(self.recent) if _matches(r, query)]
        return rows[: query.limit], "memory"

    async def usage(self, query: UsageQuery) -> tuple[dict[str, dict[str, float]], str]:
        """Usage per key over the rows ``query`` selects, and where it came from ("db" or "memory")."""
        await self.flush()
        if self._healthy:
            try:
                return await trio.to_thread.run_sync(self._store.usage, query), "db"
            except Exception as exc:
                self._warn(f"cannot read {self.path}: {exc}")
        return sum_records(self.recent, query), "memory"

    async def token_use(self, since: float) -> list[tuple[str, float, int]]:
        """(key, ended at, tokens) of named keys' requests that ended after ``since`` ([] when unreadable)."""
        try:
            return await trio.to_thread.run_sync(self._store.token_use, since)
        except Exception as exc:
            self._warn(f"cannot read {self.path}: {exc}")
            return []

    # -------------------------------------------------------------------------------------- faults
    def _lose(self, count: int, why: str, *, broken: bool = True) -> None:
        self.lost += count
        if broken:
            self._healthy = False
        self._warn(f"{why}; {count} history row(s) lost ({self.lost} in all)")

    def _warn(self, message: str) -> None:
        self.last_error = message
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY:
            self._last_warning = now
            log.warning("request history: %s", message)
