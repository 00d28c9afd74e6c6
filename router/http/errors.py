"""Errors in the OpenAI shape: ``{"error": {"message", "type", "code"}}``, and the one table that says which
HTTP status and error type each code is answered with.

A code is a fact: the scheduler's (``statemachine.RejectCode``: why it ended a request) or the HTTP layer's
own (:class:`HttpCode`: a refusal before anything reached the scheduler, or a replica's failure). ``ANSWERS``
maps every one of them to its status and type; no other place picks a status for an error. A few codes
pass on a status the other side chose (a replica's error, a peer's failure, a protocol error quart raised):
their entry is the status used when that side gave none, or one that is not an error of its kind.

``internal_error`` is the answer to anything a handler did not expect: a 500 whose message carries a short
id that the log line with the traceback carries too, so a report can be matched to its cause.
"""

from __future__ import annotations

import enum
import json
import logging
import secrets
from collections.abc import Iterable, Mapping

import attrs
from quart import Response

from statemachine import RejectCode

log = logging.getLogger("router")


class HttpCode(enum.StrEnum):
    """The HTTP layer's own error codes."""

    INVALID_JSON = "invalid_json"  # the body is not a JSON object
    INVALID_TYPE = "invalid_type"  # a known field has the wrong type
    INVALID_REQUEST = "invalid_request"  # the replica refused the request as the client's mistake
    INVALID_HEADER = "invalid_header"
    INVALID_PATH = "invalid_path"
    INVALID_FILTER = "invalid_filter"  # a history or timeline query
    INVALID_CONFIG = "invalid_config"  # a reload's new config
    INVALID_CLASS = "invalid_class"  # x-router-class or service_tier names no class
    INVALID_KEEP_ALIVE = "invalid_keep_alive"  # keep_alive is neither seconds nor a duration
    MODEL_REQUIRED = "model_required"
    POOL_NOT_ALLOWED = "pool_not_allowed"  # a pool where a single model is needed
    BAD_REQUEST = "bad_request"  # quart's own 400
    INVALID_API_KEY = "invalid_api_key"
    PERMISSION_DENIED = "permission_denied"  # a model outside the key's scope, an admin action without rights
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # a key over its requests_per_minute or tokens_per_day
    CROSS_SITE_NOT_ALLOWED = "cross_site_not_allowed"
    HOST_NOT_ALLOWED = "host_not_allowed"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    NOT_FOUND = "not_found"
    REPLICA_NOT_FOUND = "replica_not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TIMEOUT = "request_timeout"  # the body did not arrive in time
    REQUEST_TOO_LARGE = "request_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    HEADERS_TOO_LARGE = "headers_too_large"
    HTTP_ERROR = "http_error"  # any other protocol error quart raised (its status is passed on)
    INTERNAL_ERROR = "internal_error"
    UPSTREAM_ERROR = "upstream_error"  # a replica's error reply, wrapped (its status is passed on)
    UPSTREAM_UNREACHABLE = "upstream_unreachable"  # the replica did not answer
    REPLICA_FAILED = "replica_failed"  # the replica broke off a stream
    NOT_SUPPORTED = "not_supported"  # an API call the router does not offer (Ollama's model management)


ErrorCode = RejectCode | HttpCode


@attrs.frozen
class Answer:
    """How a code is answered: its HTTP status and OpenAI error type; ``passes_on``: a status the other
    side chose replaces ``status`` when it is at least ``passes_on`` (None: never)."""

    status: int
    type: str
    passes_on: int | None = None


_CLIENT, _AUTH, _DENIED, _LIMIT, _SERVER = (
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "rate_limit_error",
    "server_error",
)
ANSWERS: Mapping[ErrorCode, Answer] = {
    RejectCode.QUEUE_FULL: Answer(503, _SERVER),
    RejectCode.KEY_QUEUE_FULL: Answer(429, _LIMIT),
    RejectCode.MODEL_NOT_FOUND: Answer(404, _CLIENT),
    RejectCode.MODEL_UNAVAILABLE: Answer(503, _SERVER),
    RejectCode.CONTEXT_LENGTH_EXCEEDED: Answer(400, _CLIENT),
    RejectCode.LOAD_FAILED: Answer(503, _SERVER),
    RejectCode.REPLICA_EXITED: Answer(502, _SERVER),
    RejectCode.SHUTTING_DOWN: Answer(503, _SERVER),
    RejectCode.PEER_FAILED: Answer(502, _SERVER, passes_on=500),  # the peer's own 5xx, else 502
    RejectCode.PEER_UNREACHABLE: Answer(502, _SERVER, passes_on=500),
    RejectCode.LOOP_DETECTED: Answer(508, _SERVER),
    HttpCode.INVALID_JSON: Answer(400, _CLIENT),
    HttpCode.INVALID_TYPE: Answer(400, _CLIENT),
    HttpCode.INVALID_REQUEST: Answer(400, _CLIENT),
    HttpCode.INVALID_HEADER: Answer(400, _CLIENT),
    HttpCode.INVALID_PATH: Answer(400, _CLIENT),
    HttpCode.INVALID_FILTER: Answer(400, _CLIENT),
    HttpCode.INVALID_CONFIG: Answer(400, _CLIENT),
    HttpCode.INVALID_CLASS: Answer(400, _CLIENT),
    HttpCode.INVALID_KEEP_ALIVE: Answer(400, _CLIENT),
    HttpCode.MODEL_REQUIRED: Answer(400, _CLIENT),
    HttpCode.POOL_NOT_ALLOWED: Answer(400, _CLIENT),
    HttpCode.BAD_REQUEST: Answer(400, _CLIENT),
    HttpCode.INVALID_API_KEY: Answer(401, _AUTH),
    HttpCode.PERMISSION_DENIED: Answer(403, _DENIED),
    HttpCode.RATE_LIMIT_EXCEEDED: Answer(429, _LIMIT),
    HttpCode.CROSS_SITE_NOT_ALLOWED: Answer(403, _DENIED),
    HttpCode.HOST_NOT_ALLOWED: Answer(403, _DENIED),
    HttpCode.ORIGIN_NOT_ALLOWED: Answer(403, _DENIED),
    HttpCode.NOT_FOUND: Answer(404, _CLIENT),
    HttpCode.REPLICA_NOT_FOUND: Answer(404, _CLIENT),
    HttpCode.METHOD_NOT_ALLOWED: Answer(405, _CLIENT),
    HttpCode.REQUEST_TIMEOUT: Answer(408, _CLIENT),
    HttpCode.REQUEST_TOO_LARGE: Answer(413, _CLIENT),
    HttpCode.UNSUPPORTED_MEDIA_TYPE: Answer(415, _CLIENT),
    HttpCode.HEADERS_TOO_LARGE: Answer(431, _CLIENT),
    HttpCode.HTTP_ERROR: Answer(400, _CLIENT, passes_on=400),
    HttpCode.INTERNAL_ERROR: Answer(500, _SERVER),
    HttpCode.UPSTREAM_ERROR: Answer(502, _SERVER, passes_on=400),  # the replica's own status
    HttpCode.UPSTREAM_UNREACHABLE: Answer(502, _SERVER),
    HttpCode.REPLICA_FAILED: Answer(502, _SERVER),
    HttpCode.NOT_SUPPORTED: Answer(501, _SERVER),
}

# Quart's own HTTP errors carry only a status: the code each is answered with (any other: http_error).
QUART_CODES: Mapping[int, HttpCode] = {
    400: HttpCode.BAD_REQUEST,
    404: HttpCode.NOT_FOUND,
    405: HttpCode.METHOD_NOT_ALLOWED,
    408: HttpCode.REQUEST_TIMEOUT,
    413: HttpCode.REQUEST_TOO_LARGE,
    415: HttpCode.UNSUPPORTED_MEDIA_TYPE,
}


def status_of(code: ErrorCode, given: int | None = None) -> int:
    """The status ``code`` is answered with; ``given``: the status the other side chose, for a code that
    passes one on."""
    answer = ANSWERS[code]
    if given is not None and answer.passes_on is not None and given >= answer.passes_on:
        return given
    return answer.status


def error_body(code: ErrorCode, message: str, given: int | None = None) -> dict[str, dict[str, str]]:
    """The OpenAI error shape. A passed-on status of the other kind (a replica's 5xx, say) gives the type
    that status calls for."""
    status = status_of(code, given)
    kind = ANSWERS[code].type
    if status != ANSWERS[code].status:
        kind = _SERVER if status >= 500 else {401: _AUTH, 403: _DENIED, 429: _LIMIT}.get(status, _CLIENT)
    return {"error": {"message": message, "type": kind, "code": str(code)}}


def error_response(
    code: ErrorCode, message: str, headers: Mapping[str, str] | None = None, *, given: int | None = None
) -> Response:
    body = json.dumps(error_body(code, message, given))
    response = Response(body, status=status_of(code, given), content_type="application/json")
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def sse_error(code: ErrorCode, message: str) -> bytes:
    """An error as one server-sent event, for streams that have already begun."""
    return b"data: " + json.dumps(error_body(code, message)).encode() + b"\n\n"


def unknown_model_message(name: object, known: Iterable[str]) -> str:
    names = ", ".join(sorted(known))
    return f"model '{name}' is not served here; known: {names}"


def unknown_model(name: object, known: Iterable[str]) -> Response:
    """404 for a name that matches no model (or pool), listing the names that do."""
    return error_response(RejectCode.MODEL_NOT_FOUND, unknown_model_message(name, known))


def internal_error_message(exc: BaseException, method: str, path: str) -> str:
    """The message of a 500 for an exception no handler expected (logged with its traceback under an id)."""
    ident = secrets.token_hex(4)
    log.error("internal error %s on %s %s", ident, method, ascii(path), exc_info=exc)
    return f"internal error in the router (id {ident}); its log has the details"


def internal_error(exc: BaseException, method: str, path: str) -> Response:
    return error_response(HttpCode.INTERNAL_ERROR, internal_error_message(exc, method, path))
