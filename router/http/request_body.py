"""Parse a client's JSON request body within bounds, and check the fields the router itself reads.

This is the one place where text from a client's body becomes Python strings the router keeps (model
names, error messages, history rows, metric labels, log lines), so it is where invalid Unicode is dealt
with. JSON can spell a lone UTF-16 surrogate (``"\\ud800"``) that no UTF-8 encoder accepts: SQLite,
prometheus, logging and ``str.encode`` all fail on it. A body holding one is refused here with 400 — which
is also what llama-server answers for it (nlohmann::json rejects such strings), so nothing that would have
worked is lost. Every other way client text comes in is valid Unicode by construction: hypercorn
percent-decodes the path with ``errors="replace"``, werkzeug does the same for query arguments, and header
values are decoded as Latin-1. Text from replicas is cleaned where records are built
(``records.RequestRecord``).

Limits (each answered 400 in the OpenAI error shape, naming the limit):

- nesting: at most ``MAX_DEPTH`` (64) arrays and objects inside each other. llama-server itself parses any
  depth (nlohmann::json keeps its own stack); Python's parser and the router's own walks over a body recurse,
  so the router stops well before that. Chat, tool and JSON-schema documents need far less.
- numbers: ``NaN`` and ``Infinity`` are not JSON; a number beyond the range of a double, or an integer
  with more than 4300 digits (Python's limit), is refused.
- size: the body is bounded before parsing by ``max_body_mib`` (413, see ``app.py``).

Field types: ``check_fields`` knows what the router reads from a body (``model``, ``stream``, the output
token counts, ``messages``, ``system``, ``input``, ``prompt``) and answers 400 naming the field and the
type expected when one of them has another type. ``null`` counts as absent, as in llama-server.

Unread bodies: handlers read a body with ``read_body``. An answer that goes out before the request's body
was read (a refused key, an unknown path, a GET with a body) closes the connection. Kept alive, such a
connection now and then never took in the client's next request (hypercorn 0.18 under quart-trio: about one
time in four for /unload, /unload refused for its key, then a completion); a new connection always works.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from quart import g, request

from router.http.errors import HttpCode

MAX_DEPTH = 64

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape that spells a surrogate (paired ones too): only bodies holding one need the slow look.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")

_LEAVES = frozenset({int, float, bool, type(None), str})
_NUMBER = "a number"
# field -> (accepted Python types, how the type is named to the client)
FieldTypes = Mapping[str, tuple[tuple[type, ...], str]]
FIELD_TYPES: FieldTypes = {
    "model": ((str,), "a string"),
    "stream": ((bool,), "a boolean"),
    "max_tokens": ((int, float), _NUMBER),
    "max_completion_tokens": ((int, float), _NUMBER),
    "n_predict": ((int, float), _NUMBER),
    "max_output_tokens": ((int, float), _NUMBER),
    "messages": ((list,), "an array of objects"),
    "system": ((str, list), "a string or an array"),
    "input": ((str, list, dict), "a string, an array or an object"),
    "prompt": ((str, list, dict), "a string, an array or an object"),
}


class BodyError(ValueError):
    """The body cannot be used; ``str(error)`` is the message for the client."""

    def __init__(self, message: str, code: HttpCode = HttpCode.INVALID_JSON) -> None:
        super().__init__(message)
        self.code = code


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def parse_json(raw: bytes) -> Any:
    """The JSON document in ``raw`` (empty: None), within the limits above; raises BodyError."""
    if not raw.strip():
        return None
    try:
        doc = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise BodyError(_too_deep(None)) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the hooks above, too many digits
        raise BodyError(f"the request body is not valid JSON: {exc}") from None
    if isinstance(doc, dict | list):
        _check_nesting(doc, raw)
    return doc


def json_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object within the limits above, else None (a body the replica judges itself)."""
    try:
        doc = parse_json(raw)
    except BodyError:
        return None
    return doc if isinstance(doc, dict) else None


def parse_object(raw: bytes, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object; an empty body is ``{}`` when ``empty_ok``. Raises BodyError."""
    doc = parse_json(raw)
    if doc is None and empty_ok:
        return {}
    if not isinstance(doc, dict):
        raise BodyError("the request body must be a JSON object")
    return doc


def check_fields(body: Mapping[str, Any], fields: FieldTypes = FIELD_TYPES) -> None:
    """Raise BodyError (code ``invalid_type``) for the first known field whose value has the wrong type."""
    for name, (types, expected) in fields.items():
        value = body.get(name)
        if value is None:
            continue
        wrong = isinstance(value, bool) and bool not in types
        if wrong or not isinstance(value, types):
            raise BodyError(
                f"'{name}' must be {expected} (or null), not {_kind(value)}", HttpCode.INVALID_TYPE
            )
        if name == "messages":
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    message = f"'messages[{index}]' must be an object, not {_kind(item)}"
                    raise BodyError(message, HttpCode.INVALID_TYPE)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _too_deep(field: str | None) -> str:
    where = "" if field is None else f" (in '{_printable(field)}')"
    limit = f"the router accepts at most {MAX_DEPTH}"
    return f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep{where}; {limit}"


def _printable(text: str) -> str:
    """``text`` for an error message: valid Unicode, short, no control characters."""
    clean = _LONE_SURROGATE.sub("\ufffd", text)
    clean = "".join(c if c.isprintable() else "?" for c in clean[:80])
    return clean + ("..." if len(text) > 80 else "")


def _check_nesting(doc: dict[str, Any] | list[Any], raw: bytes) -> None:
    """Depth and lone surrogates, with one walk over the containers (skipped when it cannot matter)."""
    texts = _SURROGATE_ESCAPE.search(raw) is not None
    if not texts and raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    items = doc.items() if isinstance(doc, dict) else ((None, v) for v in doc)
    for field, value in items:
        problem = _walk(value, texts) if not (texts and field and _LONE_SURROGATE.search(field)) else "text"
        if problem == "deep":
            raise BodyError(_too_deep(field))
        if problem == "text":
            where = "" if field is None else f" in '{_printable(field)}'"
            raise BodyError(
                f"the request body holds a lone UTF-16 surrogate escape (such as \\ud800 without its pair)"
                f"{where}; JSON strings must be valid Unicode"
            )


def _walk(value: Any, texts: bool) -> str | None:
    """Whether ``value`` (at depth 2) nests beyond MAX_DEPTH ("deep") or holds a lone surrogate ("text")."""
    if texts and isinstance(value, str):
        return "text" if _LONE_SURROGATE.search(value) else None
    stack: list[tuple[Any, int]] = [(value, 2)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > MAX_DEPTH:
                return "deep"
            for key, child in node.items():
                if texts and _LONE_SURROGATE.search(key):
                    return "text"
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif texts and isinstance(child, str) and _LONE_SURROGATE.search(child):
                    return "text"
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                return "deep"
            if _LEAVES.issuperset(map(type, node)) and not (texts and str in set(map(type, node))):
                continue  # numbers and the like (token arrays): nothing below to look at
            for child in node:
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif texts and isinstance(child, str) and _LONE_SURROGATE.search(child):
                    return "text"
    return None


async def read_body() -> bytes:
    """The request's body (bounded by MAX_CONTENT_LENGTH: 413 beyond), noted as read."""
    raw = await request.get_data(cache=False)
    g.body_read = True
    return raw


def body_left_unread() -> bool:
    """Whether the request came with a body that its handler did not read."""
    sent = bool(request.content_length) or "transfer-encoding" in request.headers
    return sent and not g.get("body_read", False)
