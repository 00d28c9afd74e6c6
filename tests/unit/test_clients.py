"""Who a request comes from and what it may do: the client a key names, the class a request is served in
(its client's, lowered on request, never raised), and the scope of a key's ``models`` globs over model,
pool and alias names."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.load import Config
from router.http.access import ANONYMOUS, Client, identify
from router.http.browser_guard import Refusal
from router.http.errors import HttpCode, error_body, status_of
from router.http.request_class import request_class
from router.http.scope import scope_refusal, usable, visible
from statemachine import RequestClass
from tests.unit.config_builders import build

INTERACTIVE, STANDARD, BATCH = RequestClass.INTERACTIVE, RequestClass.STANDARD, RequestClass.BATCH


def keyed() -> Config:
    """qwen (alias qwen-latest) and small, the pool chat of both (alias auto-chat), and two named keys."""

    def change(data: dict[str, Any]) -> None:
        data["keys"] = {
            "alice": {"key": "sk-alice", "class": "interactive", "models": ["qwen-latest"], "admin": True},
            "bob": {"key": "sk-bob", "class": "batch", "models": ["auto-*"]},
        }

    return build(change)


def test_a_key_names_its_client_and_plain_keys_are_anonymous() -> None:
    config = keyed()
    plain = (b"sk-plain",)
    alice = identify(plain, config.keys, "sk-alice")
    assert alice == Client("alice", INTERACTIVE, ("qwen-latest",), admin=True)
    assert identify(plain, config.keys, "sk-bob") == Client("bob", BATCH, ("auto-*",), admin=False)
    assert identify(plain, config.keys, "sk-plain") is ANONYMOUS
    assert Client("", STANDARD, None, admin=True) == ANONYMOUS
    for presented in (None, "", "sk-alic", "sk-alice2", "SK-ALICE"):
        assert identify(plain, config.keys, presented) is None, presented


# (the client's class, the x-router-class header, the body's service_tier, the class served)
CLASS_CASES: list[tuple[RequestClass, str | None, Any, RequestClass]] = [
    (STANDARD, None, None, STANDARD),
    (INTERACTIVE, None, None, INTERACTIVE),
    (INTERACTIVE, "batch", None, BATCH),
    (INTERACTIVE, " Standard ", None, STANDARD),
    (STANDARD, "interactive", None, STANDARD),  # never above the client's class
    (BATCH, "interactive", None, BATCH),
    (INTERACTIVE, None, "flex", BATCH),
    (INTERACTIVE, None, "priority", INTERACTIVE),
    (STANDARD, None, "priority", STANDARD),
    (INTERACTIVE, None, "auto", INTERACTIVE),
    (BATCH, None, "default", BATCH),
    (STANDARD, None, "standard_only", STANDARD),
    (INTERACTIVE, "standard", "flex", BATCH),  # with both, the lower one counts
    (INTERACTIVE, "batch", "priority", BATCH),
]


@pytest.mark.parametrize(("own", "header", "tier", "served"), CLASS_CASES)
def test_a_request_lowers_its_class_and_never_raises_it(
    own: RequestClass, header: str | None, tier: Any, served: RequestClass
) -> None:
    headers = {} if header is None else {"x-router-class": header}
    body = {"model": "m"} if tier is None else {"model": "m", "service_tier": tier}
    assert request_class(Client(klass=own), headers, body) == served
    if tier is None:  # a request without a JSON body (a GET) is judged by its header alone
        assert request_class(Client(klass=own), headers, None) == served


@pytest.mark.parametrize(
    ("header", "tier"),
    [("urgent", None), ("", None), (None, "turbo"), (None, 3), (None, ["flex"]), (None, "FLEX")],
)
def test_an_unknown_class_is_refused_as_the_clients_mistake(header: str | None, tier: Any) -> None:
    headers = {} if header is None else {"x-router-class": header}
    refusal = request_class(ANONYMOUS, headers, {"service_tier": tier})
    assert isinstance(refusal, Refusal) and refusal.code == HttpCode.INVALID_CLASS
    assert status_of(refusal.code) == 400
    assert error_body(refusal.code, refusal.message)["error"]["type"] == "invalid_request_error"


def test_scope_globs_match_names_and_aliases() -> None:
    config = keyed()
    alice = identify((), config.keys, "sk-alice")
    bob = identify((), config.keys, "sk-bob")
    assert alice is not None and bob is not None
    # alice's glob names qwen by its alias: qwen is in scope under every name, small is not.
    assert usable(config, alice, "qwen") and usable(config, alice, "qwen", "qwen-latest")
    assert not usable(config, alice, "small")
    # The pool chat: alice has a member (qwen) but not the pool; bob the pool (by its alias) but no member.
    assert not usable(config, alice, "chat")
    assert not usable(config, bob, "chat", "auto-chat")
    assert all(usable(config, ANONYMOUS, name) for name in ("qwen", "small", "chat"))
    refusal = scope_refusal(config, bob, "chat", "auto-chat")
    assert refusal is not None and refusal.code == HttpCode.PERMISSION_DENIED
    assert "none of its members (qwen, small)" in refusal.message and "keys.bob.models" in refusal.message
    refusal = scope_refusal(config, alice, "small", "small")
    assert refusal is not None and "'small'" in refusal.message and status_of(refusal.code) == 403
    assert error_body(refusal.code, refusal.message)["error"]["type"] == "permission_error"
    assert scope_refusal(config, alice, "qwen", None) is None


def test_a_pool_needs_itself_and_one_member_in_scope() -> None:
    config = keyed()
    both = Client("carol", STANDARD, ("auto-chat", "sm*"), admin=False)
    assert usable(config, both, "chat") and usable(config, both, "small") and not usable(config, both, "qwen")
    entries = [{"id": name} for name in ("qwen", "small", "chat", "peer-model")]
    assert [e["id"] for e in visible(config, both, entries)] == ["small", "chat"]
    assert visible(config, ANONYMOUS, entries) == entries
    assert visible(config, Client(scope=()), entries) == []
    peer = Client("dave", STANDARD, ("peer-*",), admin=False)
    assert [e["id"] for e in visible(config, peer, entries)] == ["peer-model"]
