"""Bounded parsing and field checks of request bodies; shaping of replica errors. No router needed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.http.replica_errors import TEXT_LIMIT, shape_replica_error
from router.http.request_body import MAX_DEPTH, BodyError, check_fields, parse_json, parse_object
from router.http.request_headers import HEADERS_LIMIT, bad_header, headers_too_large
from router.journal.records import RequestRecord


def nested(depth: int) -> bytes:
    """An object whose field "x" holds arrays nested so that the whole body is ``depth`` levels deep."""
    return b'{"x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def refusal(raw: bytes) -> BodyError:
    with pytest.raises(BodyError) as caught:
        check_fields(parse_object(raw))
    return caught.value


def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_refused_naming_the_limit() -> None:
    assert parse_object(nested(MAX_DEPTH))["x"] is not None
    error = refusal(nested(MAX_DEPTH + 1))
    assert error.code == "invalid_json"
    assert f"more than {MAX_DEPTH} levels deep (in 'x')" in str(error)


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_nesting_beyond_pythons_own_recursion_limit_is_the_same_refusal(depth: int) -> None:
    assert f"more than {MAX_DEPTH} levels deep" in str(refusal(b"[" * depth + b"]" * depth))
    assert f"more than {MAX_DEPTH} levels deep" in str(refusal(b'{"a": ' + b'{"b": ' * depth))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "\\ud800"}',
        b'{"messages": [{"role": "user", "content": "a\\udfff"}]}',
        b'{"\\udc00": 1}',
        b'{"x": {"\\ud83d": 1}}',
    ],
    ids=["model", "content", "key", "inner-key"],
)
def test_a_lone_surrogate_anywhere_is_refused(raw: bytes) -> None:
    error = refusal(raw)
    assert error.code == "invalid_json"
    assert "lone UTF-16 surrogate" in str(error)
    str(error).encode("utf-8")  # the message itself is valid Unicode


def test_a_surrogate_pair_is_fine() -> None:
    assert parse_object(b'{"model": "\\ud83d\\ude00"}') == {"model": "\N{GRINNING FACE}"}


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"a": 1e400}', "out of range"),
        (b'{"a": ' + b"9" * 5000 + b"}", "4300 digits"),
        (b"\xff\xfe{", "not valid JSON"),
        (b'{"a": ', "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b"", "must be a JSON object"),
    ],
    ids=["nan", "infinity", "overflow", "digits", "not-utf8", "cut-off", "array", "empty"],
)
def test_what_is_not_json_or_not_an_object_is_refused(raw: bytes, words: str) -> None:
    assert words in str(refusal(raw))


def test_an_empty_body_may_count_as_an_empty_object() -> None:
    assert parse_object(b"  ", empty_ok=True) == {}
    assert parse_json(b"") is None


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("model", 5, "'model' must be a string (or null), not a number"),
        ("stream", "yes", "'stream' must be a boolean (or null), not a string"),
        ("max_tokens", True, "'max_tokens' must be a number (or null), not a boolean"),
        ("max_completion_tokens", "10", "'max_completion_tokens' must be a number"),
        ("messages", "x", "'messages' must be an array of objects (or null), not a string"),
        ("messages", [{"role": "user"}, 3], "'messages[1]' must be an object, not a number"),
        ("system", 5, "'system' must be a string or an array"),
        ("input", 5, "'input' must be a string, an array or an object (or null), not a number"),
        ("prompt", False, "'prompt' must be a string, an array or an object"),
    ],
)
def test_a_field_the_router_reads_with_the_wrong_type_is_named(field: str, value: Any, expected: str) -> None:
    error = refusal(json.dumps({"model": "a", field: value}).encode())
    assert error.code == "invalid_type"
    assert expected in str(error)


def test_right_types_and_nulls_pass() -> None:
    body = {
        "model": "a",
        "stream": None,
        "max_tokens": 1.5,
        "messages": [{"role": "user", "content": "hi"}],
        "input": {"prompt_string": "x"},
        "prompt": [1, 2, "three"],
        "system": [{"type": "text", "text": "be brief"}],
        "user": 5,  # not read by the router: the replica judges it
    }
    check_fields(parse_object(json.dumps(body).encode()))


def test_replica_errors_in_json_with_an_error_object_pass_unchanged() -> None:
    body = b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}'
    error = shape_replica_error("a", 404, body)
    assert (error.status, error.body, error.message, error.wrapped) == (404, body, "File Not Found", False)


@pytest.mark.parametrize(
    "message",
    [
        "'messages' is required",
        'Failed to parse tools: Expected \'tools\' to be an array, got "x"; tools = "x"',
        "Failed to parse messages: Missing 'role' in message: {}",
        "[json.exception.type_error.302] type must be string, but is number",
    ],
)
def test_replica_500s_caused_by_the_body_become_400_with_the_replicas_message(message: str) -> None:
    body = json.dumps({"error": {"code": 500, "message": message, "type": "server_error"}}).encode()
    error = shape_replica_error("a", 500, body)
    assert error.status == 400
    assert json.loads(error.body) == {
        "error": {"message": message, "type": "invalid_request_error", "code": "invalid_request"}
    }


def test_other_replica_500s_stay_500() -> None:
    body = json.dumps({"error": {"code": 500, "message": "CUDA error: out of memory"}}).encode()
    assert shape_replica_error("a", 500, body).status == 500


@pytest.mark.parametrize(
    ("status", "body", "text"),
    [
        (400, b"", "the replica of 'a' answered 400 Bad Request with an empty body"),
        (415, b"Error: gzip is not supported", "answered 415 Unsupported Media Type: Error: gzip is not"),
        (502, b"<html>\n<h1>Down</h1></html>", "answered 502 Bad Gateway: <html> <h1>Down</h1>"),
        (404, b'{"detail": "nope"}', 'answered 404 Not Found: {"detail": "nope"}'),
        (400, b'{"error": "just a string"}', "answered 400 Bad Request:"),
        (599, b"odd", "answered 599: odd"),
    ],
)
def test_other_replica_errors_are_wrapped_with_status_and_text(status: int, body: bytes, text: str) -> None:
    error = shape_replica_error("a", status, body)
    assert error.status == status and error.wrapped
    inner = json.loads(error.body)["error"]
    assert inner["code"] == "upstream_error" and text in inner["message"]
    assert inner["type"] == ("server_error" if status >= 500 else "invalid_request_error")


def test_wrapped_text_is_cut() -> None:
    error = shape_replica_error(None, 400, b"x" * 10_000)
    message = json.loads(error.body)["error"]["message"]
    assert message.startswith("the replica answered 400") and len(message) < TEXT_LIMIT + 60
    assert message.endswith("...")


def test_header_values_with_control_characters_are_named() -> None:
    assert bad_header([("X-Ok", "tab\tand \x80\xff obs-text")]) is None
    message = bad_header([("X-Ok", "fine"), ("X-Bad", "a\x01b")])
    assert message is not None and "'X-Bad'" in message and "0x01" in message
    assert headers_too_large([("X-Big", "a" * HEADERS_LIMIT)]) is not None
    assert headers_too_large([("X-Small", "a" * 1000)]) is None


def test_records_hold_valid_unicode_whatever_they_are_given() -> None:
    record = RequestRecord(
        at=0.0,
        client="c",
        endpoint="/v1/chat/completions",
        model_asked="\ud800",
        model_served=None,
        status=400,
        duration=0.0,
        error="replica said \udfff",
    )
    assert record.model_asked == "\ufffd" and record.error == "replica said \ufffd"
