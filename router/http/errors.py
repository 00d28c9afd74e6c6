"""Errors in the OpenAI shape: ``{"error": {"message", "type", "code"}}``.

``internal_error`` is the answer to anything a handler did not expect: a 500 whose message carries a short
id that the log line with the traceback carries too, so a report can be matched to its cause.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping

from quart import Response

log = logging.getLogger("router")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


def error_body(status: int, code: str, message: str) -> dict[str, dict[str, str]]:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "code": code}}


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    body = json.dumps(error_body(status, code, message))
    response = Response(body, status=status, content_type="application/json")
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def sse_error(status: int, code: str, message: str) -> bytes:
    """An error as one server-sent event, for streams that have already begun."""
    return b"data: " + json.dumps(error_body(status, code, message)).encode() + b"\n\n"


def unknown_model_message(name: object, known: Iterable[str]) -> str:
    names = ", ".join(sorted(known))
    return f"model '{name}' is not served here; known: {names}"


def unknown_model(name: object, known: Iterable[str]) -> Response:
    """404 for a name that matches no model (or pool), listing the names that do."""
    return error_response(404, "model_not_found", unknown_model_message(name, known))


def internal_error_message(exc: BaseException, method: str, path: str) -> str:
    """The message of a 500 for an exception no handler expected (logged with its traceback under an id)."""
    ident = secrets.token_hex(4)
    log.error("internal error %s on %s %s", ident, method, ascii(path), exc_info=exc)
    return f"internal error in the router (id {ident}); its log has the details"


def internal_error(exc: BaseException, method: str, path: str) -> Response:
    return error_response(500, "internal_error", internal_error_message(exc, method, path))
