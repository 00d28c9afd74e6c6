"""What the router shows about itself: /metrics, /history, the /dash page and its timeline, /chat/{model}.

``start_observers`` creates the request history, the GPU sampler and the metrics of a router and starts
their tasks (and the probe of its rpc-servers); ``register_dash`` adds their HTTP routes to the app.
Requests refused before admission (no such model, bad JSON, missing API key, body too large) never reach
the proxy; an ``after_request`` hook records them so that the history and the request counters see every
API call.

Routes:

- ``GET /metrics``: Prometheus text (see ``router.observe.metrics``).
- ``GET /history?limit=&model=&status=``: ``{"rows": [...], "source": "db"|"memory", "written", "lost"}``,
  newest first. ``status`` is a code, ``2xx``/``4xx``/``5xx``, ``ok`` or ``error``.
- ``GET /dash``: the dashboard (static files from ``router/http/static``); it polls /status, /history,
  /dash/timeline and /plan (each model's placement verdict in words).
- ``GET /dash/timeline?since=T``: per-GPU samples of the last hour newer than wall-clock time ``T``, and
  the queue with each request's age right now.
- ``/chat/{model}/...``: see ``router.http.chat_page``.
- ``/translate``, ``/chat``, ``/talk``: see ``router.http.pages``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import attrs
import httpx
import trio
from quart import Response, g, request
from quart_trio import QuartTrio

from router.config.load import Config
from router.http.admission import unadmitted_endpoint
from router.http.chat_page import register_chat
from router.http.errors import error_response
from router.http.forward import FORWARDED
from router.http.pages import DASH_FILES, register_pages
from router.http.unadmitted import unadmitted_record
from router.http.upstream import UpstreamPool
from router.journal.history import History, HistoryQuery, status_range
from router.observe.gpu_sampler import GpuSampler
from router.observe.metrics import CONTENT_TYPE, RouterMetrics
from router.observe.rpc_status import held_endpoints, rpc_endpoints
from router.shell.runtime import Router
from statemachine import queries

STATIC = Path(__file__).resolve().with_name("static")
_FORWARDED = frozenset(FORWARDED)


@attrs.define(eq=False)
class Observers:
    """The parts that watch one router; their tasks run in the nursery given to ``start_observers``."""

    history: History
    sampler: GpuSampler
    metrics: RouterMetrics


async def start_observers(
    nursery: trio.Nursery,
    config: Config,
    router: Router,
    client: httpx.AsyncClient,
    *,
    sampler: GpuSampler | None = None,
) -> Observers:
    settings = config.router
    history = History(
        settings.history_db, max_rows=settings.history_max_rows, max_age_days=settings.history_max_age_days
    )
    router.record_listeners.append(history.add)
    sampler = sampler or GpuSampler(router)
    metrics = RouterMetrics(router, client=client, history=history, sampler=sampler)
    await nursery.start(history.run)
    await nursery.start(sampler.run)
    await nursery.start(router.rpc_probe.run, lambda: rpc_endpoints(router), lambda: held_endpoints(router))
    return Observers(history, sampler, metrics)


def _json(doc: object, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def _static(name: str) -> Response:
    body = (STATIC / name).read_bytes()
    response = Response(body, content_type=DASH_FILES[name])
    response.headers["Cache-Control"] = "no-cache"
    return response


def register_dash(
    app: QuartTrio, config: Config, router: Router, observers: Observers, pool: UpstreamPool
) -> None:
    history, sampler, metrics = observers.history, observers.sampler, observers.metrics

    @app.before_request
    async def note_arrival() -> None:
        g.arrived = time.time()
        g.arrived_mono = time.monotonic()

    @app.after_request
    async def record_unadmitted(response: Response) -> Response:
        if g.get("ticket") is not None or response.status_code < 400:
            return response
        endpoint = unadmitted_endpoint(request.path, request.method, _FORWARDED)
        if endpoint is None:
            return response
        asked = (request.view_args or {}).get("model") or (request.view_args or {}).get("name")
        record = unadmitted_record(
            at=g.get("arrived", time.time()),
            arrived_mono=g.get("arrived_mono", time.monotonic()),
            client=request.remote_addr or "",
            endpoint=endpoint,
            asked=asked,
            status=response.status_code,
            body=await response.get_data(),
        )
        router.publish(record)
        return response

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
                400, "invalid_filter", "limit must be a number; status a code, 2xx/4xx/5xx, ok or error"
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
                return error_response(400, "invalid_filter", "since must be a number (seconds since 1970)")
            doc = sampler.timeline(after)
            now = trio.current_time()
            doc["queue"] = [  # ages as of now (the state's clock only moves with events)
                {"id": q.rid, "target": q.target, "age_s": round(now - q.arrived, 3), "tokens": q.tokens}
                for q in queries.queued(router.state)
            ]
            return _json(doc)
        if name not in DASH_FILES or name == "dash.html":
            return error_response(404, "not_found", f"no dashboard file '{name}'")
        return _static(name)

    register_chat(app, router, pool)
    register_pages(app)
