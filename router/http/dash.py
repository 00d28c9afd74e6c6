"""What the router shows about itself: /metrics, /history, the /dash page and its timeline, /chat/{model}.

``register_dash`` adds the HTTP routes of a router's observers (``router.observe.observers``: the request
history, the GPU sampler and the metrics) to the app. (Requests refused before admission are recorded by
admission's hooks, ``router.http.app``.)

Routes:

- ``GET /metrics``: Prometheus text (see ``router.observe.metrics``).
- ``GET /history?limit=&model=&status=``: ``{"rows": [...], "source": "db"|"memory", "written", "lost"}``,
  newest first. ``status`` is a code, ``2xx``/``4xx``/``5xx``, ``ok`` or ``error``.
- ``GET /usage?since=&until=&key=``: ``{"keys": {NAME: {requests, errors, prompt_tokens,
  completion_tokens, cached_tokens, queue_seconds, replica_seconds}}, "source"}`` over the history (every
  parameter optional: all of it, every key; "" is the anonymous clients'); times are seconds since 1970 or
  ISO 8601.
- ``GET /dash``: the dashboard (static files from ``router/http/static``); it polls /status, /history,
  /usage, /dash/timeline and /plan (each model's placement verdict in words), and follows the log of each
  loading replica (and of any replica asked for) through ``/logs/{replica}?follow=1``.
- ``GET /dash/timeline?since=T``: per-GPU samples of the last hour newer than wall-clock time ``T``, and
  the queue with each request's age right now.
- ``/chat/{model}/...``: see ``router.http.chat_page``.
- ``/translate``, ``/chat``, ``/talk``: see ``router.http.pages``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import trio
from quart import Response, request
from quart_trio import QuartTrio

from router.config.load import Config
from router.http.chat_page import register_chat
from router.http.errors import HttpCode, error_response
from router.http.pages import DASH_FILES, register_pages
from router.http.proxy import Proxy
from router.journal.history import HistoryQuery, status_range
from router.journal.key_usage import UsageQuery
from router.observe.metrics import CONTENT_TYPE
from router.observe.observers import Observers
from router.observe.status import queue_entry
from router.shell.views import Desk
from statemachine import queries

STATIC = Path(__file__).resolve().with_name("static")


def _json(doc: object, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def moment(text: str | None) -> float | None:
    """A time given as seconds since 1970 or as an ISO 8601 date or date and time (UTC unless it says);
    None when not given. Raises ValueError."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _static(name: str) -> Response:
    body = (STATIC / name).read_bytes()
    response = Response(body, content_type=DASH_FILES[name])
    response.headers["Cache-Control"] = "no-cache"
    return response


def register_dash(app: QuartTrio, config: Config, desk: Desk, observers: Observers, proxy: Proxy) -> None:
    history, sampler, metrics = observers.history, observers.sampler, observers.metrics

    @app.route("/metrics")
    async def metrics_text() -> Response:
        return Response(await metrics.render(), content_type=CONTENT_TYPE)

    @app.route("/history")
    async def history_rows() -> Response:
        args = request.args
        try:
            limit = int(args.get("limit", "100"))
            status = args.get("status") or None
            status_range(status)
        except ValueError:
            return error_response(
                HttpCode.INVALID_FILTER, "limit must be a number; status a code, 2xx/4xx/5xx, ok or error"
            )
        query = HistoryQuery(limit=limit, model=args.get("model") or None, status=status)
        rows, source = await history.query(query)
        return _json(
            {
                "rows": rows,
                "source": source,
                "written": history.written,
                "lost": history.lost,
                "pending": history.pending,
                "last_error": history.last_error,
                "last_5_min": history.recent_counts(300.0),
            }
        )

    @app.route("/usage")
    async def usage() -> Response:
        args = request.args
        try:
            since, until = moment(args.get("since")), moment(args.get("until"))
        except ValueError:
            return error_response(
                HttpCode.INVALID_FILTER,
                "since and until must be seconds since 1970 or ISO 8601 dates/times (2026-12-01T08:00Z)",
            )
        key = args.get("key")
        keys, source = await history.usage(UsageQuery(since, until, key))
        return _json({"since": since, "until": until, "keys": keys, "source": source})

    @app.route("/dash")
    async def dash_page() -> Response:
        return _static("dash.html")

    @app.route("/dash/")
    async def dash_slash() -> Response:
        return Response("", status=308, headers={"Location": "../dash"})

    @app.route("/dash/<name>")
    async def dash_file(name: str) -> Response:
        if name == "timeline":
            since = request.args.get("since")
            try:
                after = float(since) if since else None
            except ValueError:
                return error_response(HttpCode.INVALID_FILTER, "since must be a number (seconds since 1970)")
            doc = sampler.timeline(after)
            now = trio.current_time()
            # ages as of now (the state's clock only moves with events)
            doc["queue"] = [queue_entry(q, now) for q in queries.queued(desk.state)]
            return _json(doc)
        if name not in DASH_FILES or name == "dash.html":
            return error_response(HttpCode.NOT_FOUND, f"no dashboard file '{name}'")
        return _static(name)

    register_chat(app, desk, proxy)
    register_pages(app)
