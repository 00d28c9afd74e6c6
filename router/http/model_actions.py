"""``POST /models/load`` and ``POST /models/unload`` with ``{"model": NAME}``: load a model ahead of its
requests, or let it go, as llama.cpp's router mode names them. Both answer 200 as soon as the scheduler has
the order (the load itself shows on /status, /v1/models and the dashboard). They are admin actions: the same
browser guard and key rights as ``/unload`` and ``/reload`` (``router.http.browser_guard.ADMIN_PATHS``).
"""

from __future__ import annotations

import json

from quart import Response
from quart_trio import QuartTrio

from router.config.load import resolve_name
from router.http.errors import HttpCode, error_response, unknown_model
from router.http.request_body import BodyError, FieldTypes, check_fields, parse_object, read_body
from router.shell.views import Admin
from statemachine import RejectCode

MODEL_FIELDS: FieldTypes = {"model": ((str,), "a string")}


async def _asked_model(admin: Admin) -> str | Response:
    """The model the body names (aliases resolved), or the answer that refuses the body."""
    raw = await read_body()
    try:
        body = parse_object(raw)
        check_fields(body, MODEL_FIELDS)
    except BodyError as exc:
        return error_response(exc.code, str(exc))
    name = body.get("model")
    if name is None:
        return error_response(HttpCode.MODEL_REQUIRED, 'name the model: {"model": "NAME"}')
    config = admin.config
    canonical = resolve_name(config, name)
    if canonical in config.pools:
        members = ", ".join(config.pools[canonical].members)
        message = f"'{name}' is a pool; load or unload its members by name: {members}"
        return error_response(HttpCode.POOL_NOT_ALLOWED, message)
    if canonical is None or canonical not in config.models:
        return unknown_model(name, config.models)
    return canonical


def _accepted(doc: dict[str, object]) -> Response:
    return Response(json.dumps({"success": True, **doc}), content_type="application/json")


def register_model_actions(app: QuartTrio, admin: Admin) -> None:
    @app.route("/models/load", methods=["POST"])
    async def load_model() -> Response:
        found = await _asked_model(admin)
        if isinstance(found, Response):
            return found
        refusal = admin.state.settings.models[found].refusal
        if refusal is not None:
            return error_response(RejectCode.MODEL_UNAVAILABLE, refusal)
        admin.load(found)
        return _accepted({"model": found, "action": "load"})

    @app.route("/models/unload", methods=["POST"])
    async def unload_model() -> Response:
        found = await _asked_model(admin)
        if isinstance(found, Response):
            return found
        admin.unload(found, False)
        return _accepted({"model": found, "action": "unload"})
