"""What a client gets when a replica answers with an error status: always the OpenAI error shape.

- A JSON body that already holds an ``"error"`` object with a message (llama-server's own errors, the
  OpenAI and Anthropic shapes) passes unchanged, with the replica's status.
- Any other body (empty, HTML, plain text, JSON without an error object) is wrapped:
  ``{"error": {"message": "the replica of 'm' answered 400 Bad Request: <text>", "type", "code":
  "upstream_error"}}`` with the replica's status kept and the text cut at ``TEXT_LIMIT`` characters.
  cpp-httplib answers malformed requests (a multipart body, an oversized header) with an empty 400, and the
  web UI's assets answer 415 in plain text.
- llama-server answers some requests that are wrong with 500 rather than 400: it turns every exception other
  than ``std::invalid_argument`` and its JSON errors into a 500, and several checks of the request body throw
  ``std::runtime_error`` (in llama.cpp b11434: ``'messages' is required`` for Anthropic messages, ``Failed to
  parse messages: ...``, ``Failed to parse tools: ...``, the multimodal and parameter checks listed in
  ``CLIENT_FAULTS``). Those 500s are answered 400 with the replica's message: the client, not the server,
  has to change something.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import attrs

from router.http.errors import HttpCode, error_body
from router.journal.records import valid_text

TEXT_LIMIT = 500
BODY_LIMIT = 64 * 1024  # an error body larger than this is not read further

# Starts of llama-server 500 messages that are about the request body (tools/server and common/chat*.cpp).
CLIENT_FAULTS = (
    "'messages' is required",
    '"prompt" is required',
    "Failed to parse messages",
    "Failed to parse tools",
    "Failed to parse tool call arguments",
    "Cannot specify both content and content_parts",
    "Cannot use both json_schema and grammar",
    "Cannot specify grammar with tools",
    "tools param requires --jinja",
    "tool_choice param requires --jinja",
    "Only no echo is supported",
    "Unsupported param",
    "Invalid base64 value",
    "Failed to download image",
    "Failed to load image or audio file",
    "Multimodal data provided, but model does not support",
    "image input is not supported",
    "audio input is not supported",
    "video input is not supported",
    "for mtmd, input prompt must be a string",
    "Error: 'lora' must be",
    "Error: dry_sequence_breakers",
    "Unknown reasoning format",
    "[json.exception.",
)


@attrs.frozen
class ReplicaError:
    """The answer for a replica's error reply: status, body bytes, and the message to record."""

    status: int
    body: bytes
    message: str
    wrapped: bool


def _reason(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _error_message(doc: Any) -> str | None:
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return None


def client_fault(status: int, message: str) -> bool:
    """Whether a replica's ``status`` with ``message`` is really the client's mistake (see above)."""
    return status == 500 and message.startswith(CLIENT_FAULTS)


def shape_replica_error(model: str | None, status: int, body: bytes, complete: bool = True) -> ReplicaError:
    """The client's answer for a replica's error reply (``complete``: the whole body was read)."""
    doc: Any = None
    if complete:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
    message = _error_message(doc)
    if message is not None:
        if client_fault(status, message):
            message = valid_text(message)  # it may quote the client's body, lone surrogates and all
            return ReplicaError(400, _body(HttpCode.INVALID_REQUEST, message), message, True)
        return ReplicaError(status, body, message, False)
    text = " ".join(body.decode("utf-8", "replace").split())
    if len(text) > TEXT_LIMIT or not complete:
        text = text[:TEXT_LIMIT] + "..."
    name = "the replica" if model is None else f"the replica of '{model}'"
    wrapped = f"{name} answered {_reason(status)}: {text}" if text else f"{name} answered {_reason(status)}"
    if not text:
        wrapped += " with an empty body"
    return ReplicaError(status, _body(HttpCode.UPSTREAM_ERROR, wrapped, status), wrapped, True)


def _body(code: HttpCode, message: str, given: int | None = None) -> bytes:
    return json.dumps(error_body(code, message, given)).encode()
