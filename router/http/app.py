"""HTTP routes (quart-trio on hypercorn): the forwarded API, model list, status, upstream pass-through."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from router.config.load import Config, resolve_name
from router.http.access import OPEN_PATHS, key_accepted, presented_key
from router.http.browser_guard import register_guard
from router.http.errors import error_response, internal_error, unknown_model
from router.http.prefix_key import request_chain
from router.http.proxy import SAFE_SEGMENT, Proxy
from router.http.request_body import (
    BodyError,
    FieldTypes,
    body_left_unread,
    check_fields,
    parse_object,
    read_body,
)
from router.http.request_headers import bad_header, headers_too_large
from router.http.tokens import exact_prompt_tokens, prompt_upper_bound, requested_output
from router.observe.props import props_document
from router.observe.status import models_document, named_entry, replica_log, status_document
from router.shell.reload import reload_config
from router.shell.runtime import Router
from statemachine import ReplicaPhase, queries, serving_models

FORWARDED = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/completion",
    "/v1/embeddings",
    "/embeddings",
    "/v1/rerank",
    "/rerank",
    "/v1/reranking",
    "/reranking",
    "/infill",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/responses",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/chat/completions/input_tokens",
)

TOKEN_COUNTING = (
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
    "/v1/chat/completions/input_tokens",
)

UNLOAD_FIELDS: FieldTypes = {"model": ((str,), "a string"), "force": ((bool,), "a boolean")}


def create_app(config: Config, router: Router, client: httpx.AsyncClient) -> QuartTrio:
    app = QuartTrio("llama_router")
    app.config["MAX_CONTENT_LENGTH"] = config.router.max_body_mib * 1024 * 1024
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 120
    proxy = Proxy(router, client)
    register_guard(app, config.router.host, lambda: router.config.router)  # first: before the key check

    @app.before_request
    async def check_headers() -> Response | None:
        too_large = headers_too_large(request.headers.items())
        if too_large is not None:
            return error_response(431, "headers_too_large", too_large, {"Connection": "close"})
        problem = bad_header(request.headers.items())
        return None if problem is None else error_response(400, "invalid_header", problem)

    @app.before_request
    async def check_key() -> Response | None:
        keys = router.deployment.api_keys
        if not keys or request.path in OPEN_PATHS:
            return None
        if key_accepted(keys, presented_key(request.headers)):
            return None
        message = "a valid API key is required: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
        return error_response(401, "invalid_api_key", message, {"WWW-Authenticate": "Bearer"})

    @app.after_request
    async def close_after_unread_body(response: Response) -> Response:
        if body_left_unread():
            response.headers["Connection"] = "close"
        return response

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
            return error_response(413, "request_too_large", message, {"Connection": "close"})
        return error_response(status, exc.name.lower().replace(" ", "_"), exc.description or exc.name)

    def resolve(name: Any, path: str) -> tuple[str | None, Response | None]:
        if isinstance(name, str) and name:
            target = resolve_name(router.config, name)
            if target is not None:
                if path in TOKEN_COUNTING and target in router.config.pools:
                    members = ", ".join(router.config.pools[target].members)
                    message = f"'{name}' is a pool; token counting needs one of its models: {members}"
                    return None, error_response(400, "pool_not_allowed", message)
                return target, None
        default = router.config.router.default_pool
        if default is not None and path not in TOKEN_COUNTING:
            return default, None
        known = ", ".join(sorted((*router.config.models, *router.config.pools)))
        if not name:
            message = f'the request names no model; add "model" with one of: {known}'
            return None, error_response(400, "model_required", message)
        return None, unknown_model(name, (*router.config.models, *router.config.pools))

    async def needed_tokens(target: str, body: dict[str, Any]) -> int | None:
        output = requested_output(body)
        if target not in router.config.pools:
            return output or None
        upper = prompt_upper_bound(body) + output
        members = serving_models(router.deployment.settings, target)
        if upper <= min(router.launches[m].ctx_per_slot for m in members):
            return upper
        port = router.ready_port(members)
        exact = None if port is None else await exact_prompt_tokens(client, port, body)
        return upper if exact is None else exact + output

    async def forward(path: str) -> Response:
        raw = await read_body()
        try:
            body = parse_object(raw)
            check_fields(body)
        except BodyError as exc:
            return error_response(400, exc.code, str(exc))
        target, problem = resolve(body.get("model"), path)
        if problem is not None:
            return problem
        assert target is not None
        ticket = router.admit(
            target,
            asked=body.get("model") if isinstance(body.get("model"), str) else None,
            endpoint=path,
            client=request.remote_addr or "",
            tokens=await needed_tokens(target, body),
            body=body,
            prefix=request_chain(
                router.deployment.settings, router.config.router.prefix_affinity, target, body, path
            ),
        )
        g.ticket = ticket
        return await proxy.respond(
            ticket,
            method="POST",
            path=path,
            query=request.query_string,
            body=raw,
            headers=request.headers,
            stream=body.get("stream") is True,
        )

    def forwarder(path: str) -> Callable[[], Awaitable[Response]]:
        async def view() -> Response:
            return await forward(path)

        return view

    for route in FORWARDED:
        app.add_url_rule(route, endpoint=route, view_func=forwarder(route), methods=["POST"])

    @app.route("/health")
    async def health() -> Response:
        return Response(json.dumps({"status": "ok"}), content_type="application/json")

    @app.route("/v1/models")
    @app.route("/models")
    async def models() -> Response:
        return Response(json.dumps(models_document(router.config, router)), content_type="application/json")

    @app.route("/v1/models/<path:model_id>")
    @app.route("/models/<path:model_id>")
    async def one_model(model_id: str) -> Response:
        config = router.config
        entry = named_entry(config, router, model_id)
        if entry is None:
            return unknown_model(model_id, (*config.models, *config.pools))
        return Response(json.dumps(entry), content_type="application/json")

    @app.route("/plan")
    async def plan() -> Response:
        return Response(json.dumps(router.plan_document), content_type="application/json")

    @app.route("/status")
    @app.route("/status/json")
    async def status() -> Response:
        return Response(json.dumps(status_document(router.config, router)), content_type="application/json")

    @app.route("/props")
    async def props() -> Response:
        return Response(json.dumps(props_document(router.config, router)), content_type="application/json")

    @app.route("/logs/<int:replica>")
    async def logs(replica: int) -> Response:
        lines = request.args.get("lines", type=int)
        found = await replica_log(router, replica, lines)
        if found is None:
            message = f"no replica {replica} is running or exited recently; /status lists the replicas"
            return error_response(404, "replica_not_found", message)
        text, source = found
        return Response(text, content_type="text/plain; charset=utf-8", headers={"x-log-source": source})

    @app.route("/upstream/<model>/<path:rest>", methods=["GET", "POST"])
    async def upstream(model: str, rest: str) -> Response:
        target = resolve_name(router.config, model)
        if target is None or target not in router.config.models:
            return unknown_model(model, router.config.models)
        segments = rest.split("/")
        if any(s in ("", ".", "..") or not SAFE_SEGMENT.match(s) for s in segments):
            return error_response(400, "invalid_path", f"'{rest}' is not a plain path below the model")
        raw = await read_body()
        ticket = router.admit(
            target, asked=model, endpoint="/upstream", client=request.remote_addr or "", tokens=None
        )
        g.ticket = ticket
        return await proxy.respond(
            ticket,
            method=request.method,
            path=rest,
            query=request.query_string,
            body=raw,
            headers=request.headers,
            stream=False,
        )

    @app.route("/reload", methods=["POST"])
    async def reload() -> Response:
        result = await reload_config(router)
        if not result.ok:
            return error_response(400, "invalid_config", result.message)
        doc = {"reloaded": True, "restarted": list(result.restarted)}
        return Response(json.dumps(doc), content_type="application/json")

    @app.route("/unload", methods=["POST"])
    async def unload() -> Response:
        raw = await read_body()
        try:
            body = parse_object(raw, empty_ok=True)
            check_fields(body, UNLOAD_FIELDS)
        except BodyError as exc:
            return error_response(400, exc.code, str(exc))
        name = body.get("model")
        force = body.get("force") is True
        model = None
        if name is not None:
            model = resolve_name(router.config, name)
            if model is None or model not in router.config.models:
                return unknown_model(name, router.config.models)
        wait = body.get("wait", True) is not False
        # The replicas this unload stops: the answer waits for exactly these to exit, never for a
        # condition new traffic could keep false (a request after the unload may load the model again).
        asked = sorted(
            r.id
            for r in router.state.replicas
            if r.phase != ReplicaPhase.STOPPING and model in (None, r.model)
        )
        router.unload(model, force)
        if wait:
            await router.wait_until(lambda s: not any(queries.find_replica(s, i) is not None for i in asked))
        doc = {"unloaded": model or "all", "forced": force, "replicas": asked, "waited": wait}
        return Response(json.dumps(doc), content_type="application/json")

    return app
