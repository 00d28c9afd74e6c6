"""The one table of error answers (router.http.errors.ANSWERS): every code has exactly one status and type,
the scheduler's codes keep the statuses clients and the README know, and statuses passed on from the other
side (a peer, a replica, quart) replace the table's only where they are errors of that kind."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from router.http.errors import ANSWERS, QUART_CODES, HttpCode, error_body, status_of
from statemachine import RejectCode

ROOT = Path(__file__).resolve().parents[2]


def test_every_code_has_one_answer_and_no_answer_lacks_a_code() -> None:
    assert set(ANSWERS) == set(RejectCode) | set(HttpCode)
    assert not set(map(str, RejectCode)) & set(map(str, HttpCode))  # one name per fact
    for code, answer in ANSWERS.items():
        assert 400 <= answer.status < 600, code
        assert answer.type == ("server_error" if answer.status >= 500 else answer.type), code


def test_the_schedulers_codes_keep_their_statuses() -> None:
    assert {code: status_of(code) for code in RejectCode} == {
        RejectCode.QUEUE_FULL: 503,
        RejectCode.KEY_QUEUE_FULL: 429,  # a key's own bound: 429, never the whole queue's 503
        RejectCode.MODEL_NOT_FOUND: 404,
        RejectCode.MODEL_UNAVAILABLE: 503,
        RejectCode.CONTEXT_LENGTH_EXCEEDED: 400,
        RejectCode.LOAD_FAILED: 503,
        RejectCode.REPLICA_EXITED: 502,
        RejectCode.SHUTTING_DOWN: 503,
        RejectCode.PEER_FAILED: 502,
        RejectCode.PEER_UNREACHABLE: 502,
        RejectCode.LOOP_DETECTED: 508,
    }


@pytest.mark.parametrize(
    ("given", "status"), [(None, 502), (503, 503), (500, 500), (504, 504), (499, 502), (429, 502), (404, 502)]
)
def test_a_peers_failure_passes_on_its_5xx_else_502(given: int | None, status: int) -> None:
    for code in (RejectCode.PEER_FAILED, RejectCode.PEER_UNREACHABLE):
        assert status_of(code, given) == status
        assert error_body(code, "x", given)["error"] == {"message": "x", "type": "server_error", "code": code}


def test_a_replicas_error_keeps_its_status_and_the_type_that_status_calls_for() -> None:
    for given, kind in [(400, "invalid_request_error"), (401, "authentication_error"), (503, "server_error")]:
        assert status_of(HttpCode.UPSTREAM_ERROR, given) == given
        assert error_body(HttpCode.UPSTREAM_ERROR, "x", given)["error"]["type"] == kind
    assert status_of(HttpCode.INVALID_API_KEY, 500) == 401  # a fixed code ignores any status given


def test_quarts_statuses_name_codes_of_that_status() -> None:
    for status, code in QUART_CODES.items():
        assert status_of(code) == status


def _literal_codes() -> list[tuple[str, int]]:
    """Calls in router/ that make an error answer with a code or a status written as a literal."""
    code_at = {"error_reply": 0, "error_response": 0, "sse_error": 0, "error_body": 0, "Refusal": 0}
    code_at |= {"BodyError": 1, "Reject": 1}
    found = []
    for path in sorted((ROOT / "router").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            at = code_at.get(getattr(node.func, "id", getattr(node.func, "attr", "")))
            if at is None:
                continue
            args = [*node.args[at : at + 1], *(k.value for k in node.keywords if k.arg == "code")]
            if any(isinstance(a, ast.Constant) for a in args) or any(
                isinstance(a, ast.Constant) and isinstance(a.value, int) for a in node.args
            ):
                found.append((str(path.relative_to(ROOT)), node.lineno))
    return found


def test_no_answer_names_its_code_or_status_by_hand() -> None:
    assert _literal_codes() == []
