"""HTTP routes on quart-trio: model list, status, admin actions, upstream pass-through. The forwarded API
itself is served by ``router.http.forward`` in front of this app."""

from __future__ import annotations

import json
import math
import time

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from router.config.load import Config, resolve_name
from router.http.admission import check_client, check_head, current_client, unadmitted_endpoint
from router.http.browser_guard import Refusal, preflight_headers, register_cors
from router.http.errors import QUART_CODES, HttpCode, error_response, internal_error, unknown_model
from router.http.forward import FORWARDED
from router.http.model_actions import register_model_actions
from router.http.ollama.routes import register_ollama
from router.http.proxy import SAFE_SEGMENT, Proxy, upstream_headers
from router.http.reply import to_quart
from router.http.request_body import (
    BodyError,
    FieldTypes,
    body_left_unread,
    check_fields,
    json_object,
    parse_object,
    read_body,
)
from router.http.request_headers import as_sent
from router.http.scope import entry_target, scope_refusal, visible
from router.http.unadmitted import unadmitted_record
from router.observe.props import props_document
from router.observe.status import (
    follow_replica_log,
    health_document,
    models_document,
    named_entry,
    replica_log,
    status_document,
)
from router.shell.logring import SSE_KEEPALIVE, log_events, log_text
from router.shell.reload import reload_config
from router.shell.views import Admin, Desk, RouterView
from statemachine import ReplicaPhase, queries

_FORWARDED = frozenset(FORWARDED)
UNLOAD_FIELDS: FieldTypes = {"model": ((str,), "a string"), "force": ((bool,), "a boolean")}


def create_app(config: Config, admin: Admin, proxy: Proxy) -> QuartTrio:
    """The quart app: admission's hooks, the error answers, the documents, the admin actions and the
    ``/upstream`` pass-through (the dashboard and the pages are added by ``router.http.dash``)."""
    app = QuartTrio("llama_router")
    app.config["MAX_CONTENT_LENGTH"] = config.router.max_body_mib * 1024 * 1024
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 120
    _register_admission(app, config, admin)
    _register_errors(app, config)
    _register_documents(app, admin)
    _register_admin(app, admin)
    register_model_actions(app, admin)
    register_ollama(app, admin)
    _register_upstream(app, admin, proxy)
    return app


def _register_admission(app: QuartTrio, config: Config, desk: Desk) -> None:
    """Admission's hooks for the quart app: the checks of the head, and the record of an API call refused
    before admission (the forwarding path records its own)."""
    bind_host = config.router.host  # fixed until a restart, like the listening socket

    @app.before_request
    async def note_arrival() -> None:
        g.arrived = time.time()
        g.arrived_mono = time.monotonic()

    @app.before_request
    async def admit_head() -> Response | None:
        """Admission's checks of the head (router.http.admission), before any other hook."""
        current = desk.config.router  # cors_origins and allowed_hosts follow reloads
        check = check_head(
            request.method,
            request.path,
            request.headers,
            request.headers.items(),
            bind_host=bind_host,
            settings=current,
            api_keys=desk.deployment.api_keys,
            named=desk.config.keys,
        )
        verdict = check.verdict
        g.cors_origin = verdict.cors_origin
        g.client = check.client
        if verdict.preflight and verdict.cors_origin is not None:
            headers = preflight_headers(
                verdict.cors_origin,
                request.headers.get("access-control-request-headers", ""),
                request.headers.get("access-control-request-private-network", "").lower() == "true",
            )
            return Response("", status=204, headers=headers)
        refusal = check.refusal
        if refusal is None:
            return None
        return error_response(refusal.code, refusal.message, refusal.headers)

    register_cors(app, lambda: desk.config.router)

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
            key=current_client().name,
        )
        desk.publish(record)
        return response

    @app.after_request
    async def close_after_unread_body(response: Response) -> Response:
        if body_left_unread():
            response.headers["Connection"] = "close"
        return response


def _register_errors(app: QuartTrio, config: Config) -> None:
    @app.errorhandler(Exception)
    async def unexpected_error(exc: Exception) -> Response:
        return internal_error(exc, request.method, request.path)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        original = getattr(exc, "original_exception", None)
        if status == 500 and isinstance(original, BaseException):
            return internal_error(original, request.method, request.path)
        if status == 413:
            limit = config.router.max_body_mib  # fixed at startup
            message = f"request body is larger than max_body_mib = {limit} MiB; send less or raise the limit"
            # The unread rest of the body is still on the connection: close it rather than reuse it.
            return error_response(HttpCode.REQUEST_TOO_LARGE, message, {"Connection": "close"})
        code = QUART_CODES.get(status, HttpCode.HTTP_ERROR)
        return error_response(code, exc.description or exc.name, given=status)

    def served_by_the_data_path() -> Response:
        # POSTs to these paths never reach quart (router.http.forward serves them); the rules exist so that
        # other methods are answered 405 with "Allow: POST".
        raise RuntimeError("a forwarded API request reached the quart app")

    for route in FORWARDED:
        app.add_url_rule(route, endpoint=route, view_func=served_by_the_data_path, methods=["POST"])


def _register_documents(app: QuartTrio, view: RouterView) -> None:
    @app.route("/health")
    async def health() -> Response:
        return Response(json.dumps(health_document(view)), content_type="application/json")

    @app.route("/v1/models")
    @app.route("/models")
    async def models() -> Response:
        config = view.config
        document = models_document(config, view)
        document["data"] = visible(config, current_client(), document["data"])
        return Response(json.dumps(document), content_type="application/json")

    @app.route("/v1/models/<path:model_id>")
    @app.route("/models/<path:model_id>")
    async def one_model(model_id: str) -> Response:
        config = view.config
        entry = named_entry(config, view, model_id)
        if entry is None:
            return unknown_model(model_id, (*config.models, *config.pools))
        target, _ = entry_target(entry)
        refusal = scope_refusal(config, current_client(), target, model_id)
        if refusal is not None:
            return error_response(refusal.code, refusal.message)
        return Response(json.dumps(entry), content_type="application/json")

    @app.route("/plan")
    async def plan() -> Response:
        return Response(json.dumps(view.plan_document), content_type="application/json")

    @app.route("/status")
    @app.route("/status/json")
    async def status() -> Response:
        return Response(json.dumps(status_document(view.config, view)), content_type="application/json")

    @app.route("/props")
    async def props() -> Response:
        return Response(json.dumps(props_document(view.config, view)), content_type="application/json")

    @app.route("/logs/<int:replica>")
    async def logs(replica: int) -> Response:
        """A replica's output; ``follow=1``: then its new lines as they come, as text (one line each) or,
        for a client that accepts text/event-stream, as server-sent events (one ``data:`` event a line,
        and a last one named ``end``)."""
        lines = request.args.get("lines", type=int)
        missing = f"no replica {replica} is running or exited recently; /status lists the replicas"
        if request.args.get("follow", "").lower() in ("1", "true", "yes", "on"):
            sse = "text/event-stream" in request.headers.get("accept", "").lower()
            followed = follow_replica_log(view, replica, lines, quiet=SSE_KEEPALIVE if sse else math.inf)
            if followed is None:
                return error_response(HttpCode.REPLICA_NOT_FOUND, missing)
            response = Response(
                log_events(followed) if sse else log_text(followed),
                content_type="text/event-stream" if sse else "text/plain; charset=utf-8",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
            response.timeout = None  # it lasts as long as the replica
            return response
        found = await replica_log(view, replica, lines)
        if found is None:
            return error_response(HttpCode.REPLICA_NOT_FOUND, missing)
        text, source = found
        return Response(text, content_type="text/plain; charset=utf-8", headers={"x-log-source": source})


def _register_upstream(app: QuartTrio, desk: Desk, proxy: Proxy) -> None:
    @app.route("/upstream/<model>/<path:rest>", methods=["GET", "POST"])
    async def upstream(model: str, rest: str) -> Response:
        config = desk.config
        target = resolve_name(config, model)
        if target is None or target not in config.models:
            return unknown_model(model, config.models)
        segments = rest.split("/")
        if any(s in ("", ".", "..") or not SAFE_SEGMENT.match(s) for s in segments):
            return error_response(HttpCode.INVALID_PATH, f"'{rest}' is not a plain path below the model")
        raw = await read_body()
        client = current_client()
        klass = check_client(
            config, client, target, model, request.headers, json_object(raw), desk.over_limit
        )
        if isinstance(klass, Refusal):
            return error_response(klass.code, klass.message, klass.headers)
        ticket = desk.admit(
            target,
            asked=model,
            endpoint="/upstream",
            client=request.remote_addr or "",
            tokens=None,
            key=client.name,
            klass=klass,
        )
        g.ticket = ticket
        reply = await proxy.respond(
            ticket,
            method=request.method,
            path=rest,
            query=request.query_string,
            body=raw,
            headers=upstream_headers(as_sent(request.headers.items())),
            stream=False,
        )
        return to_quart(reply)


def _register_admin(app: QuartTrio, admin: Admin) -> None:
    @app.route("/reload", methods=["POST"])
    async def reload() -> Response:
        result = await reload_config(admin.router)
        if not result.ok:
            return error_response(HttpCode.INVALID_CONFIG, result.message)
        doc = {"reloaded": True, "restarted": list(result.restarted)}
        return Response(json.dumps(doc), content_type="application/json")

    @app.route("/unload", methods=["POST"])
    async def unload() -> Response:
        raw = await read_body()
        try:
            body = parse_object(raw, empty_ok=True)
            check_fields(body, UNLOAD_FIELDS)
        except BodyError as exc:
            return error_response(exc.code, str(exc))
        name = body.get("model")
        force = body.get("force") is True
        model = None
        if name is not None:
            model = resolve_name(admin.config, name)
            if model is None or model not in admin.config.models:
                return unknown_model(name, admin.config.models)
        wait = body.get("wait", True) is not False
        # The replicas this unload stops: the answer waits for exactly these to exit, never for a
        # condition new traffic could keep false (a request after the unload may load the model again).
        asked = sorted(
            r.id
            for r in admin.state.replicas
            if r.phase != ReplicaPhase.STOPPING and model in (None, r.model)
        )
        admin.unload(model, force)
        if wait:
            await admin.wait_until(lambda s: not any(queries.find_replica(s, i) is not None for i in asked))
        doc = {"unloaded": model or "all", "forced": force, "replicas": asked, "waited": wait}
        return Response(json.dumps(doc), content_type="application/json")
