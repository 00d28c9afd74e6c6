"""Browser safety as pure rules (router.http.browser_guard): host names, origins, Sec-Fetch-* headers,
admin actions, preflight answers and the CORS headers dropped from a replica's replies.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.config.load import ConfigError, RouterSettings, config_from_dict
from router.http.browser_guard import (
    canonical_origin,
    drop_cors,
    host_accepted,
    judge,
    preflight_headers,
    same_origin,
    split_host,
)
from tests.shell.browser_safety_common import APP, EVIL


def settings(**changes: Any) -> RouterSettings:
    """[router] settings as the loader makes them (canonical origins and host names)."""
    doc = {"router": dict(changes), "models": {"m": {"model": "m.gguf"}}}
    return config_from_dict(doc).router


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("LocalHost.", ("localhost", None)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::1]", ("::1", None)),
        ("::1", None),
        ("a:b", None),
        ("a:99999", None),
        ("", None),
    ],
)
def test_split_host(value: str, expected: tuple[str, int | None] | None) -> None:
    assert split_host(value) == expected


@pytest.mark.parametrize(
    ("host", "bind", "allowed", "accepted"),
    [
        ("127.0.0.1:8080", "127.0.0.1", (), True),
        ("localhost:8080", "127.0.0.1", (), True),
        ("app.localhost:8080", "127.0.0.1", (), True),
        ("127.0.0.2", "127.0.0.1", (), True),
        ("[::1]:8080", "127.0.0.1", (), True),
        ("evil.example:8080", "127.0.0.1", (), False),
        ("evil.example:8080", "localhost", (), False),
        ("evil.example:8080", "::1", (), False),
        ("192.168.1.5:8080", "127.0.0.1", (), False),
        ("evil.example", "127.0.0.1", ("*",), True),
        ("router.lan:8080", "127.0.0.1", ("router.lan",), True),
        ("a.example.lan", "127.0.0.1", (".example.lan",), True),
        ("example.lan", "127.0.0.1", (".example.lan",), True),
        ("badexample.lan", "127.0.0.1", (".example.lan",), False),
        ("evil.example", "0.0.0.0", (), True),  # bound elsewhere: only with allowed_hosts
        ("evil.example", "0.0.0.0", ("router.lan",), False),
        ("0.0.0.0:8080", "0.0.0.0", ("router.lan",), False),
        ("localhost:8080", "0.0.0.0", ("router.lan",), True),
        ("192.168.1.5:8080", "192.168.1.5", ("router.lan",), True),
        ("a b", "127.0.0.1", (), False),
        (None, "127.0.0.1", (), True),
    ],
)
def test_host_rule(host: str | None, bind: str, allowed: tuple[str, ...], accepted: bool) -> None:
    assert host_accepted(host, bind, allowed) is accepted


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("http://127.0.0.1:8080", "127.0.0.1:8081", False),
        ("http://127.0.0.1:8080", "localhost:8080", False),
        ("http://localhost", "localhost:80", True),
        ("https://router.example", "router.example", True),  # behind a TLS proxy
        ("http://[::1]:8080", "[::1]:8080", True),
        ("null", "127.0.0.1:8080", False),
        ("http://127.0.0.1:8080", None, False),
        ("http://127.0.0.1:bad", "127.0.0.1:8080", False),
    ],
)
def test_same_origin(origin: str, host: str | None, same: bool) -> None:
    assert same_origin(origin, host) is same


def test_origins_are_compared_as_browsers_send_them() -> None:
    assert canonical_origin("HTTP://LocalHost:80/") == "http://localhost"
    assert canonical_origin("https://x.example:8443") == "https://x.example:8443"
    assert canonical_origin("http://x.example/path") is None
    config = settings(cors_origins=["http://LOCALHOST:3000/", "null"])
    assert config.cors_origins == ("http://localhost:3000", "null")


def test_bad_origin_and_host_entries_are_config_errors() -> None:
    doc = {"router": {"cors_origins": ["localhost:3000"]}, "models": {"m": {"model": "m.gguf"}}}
    with pytest.raises(ConfigError, match=r"router\.cors_origins = \[\"localhost:3000\"\] is invalid"):
        config_from_dict(doc)
    doc = {"router": {"allowed_hosts": ["router.lan:8080"]}, "models": {"m": {"model": "m.gguf"}}}
    with pytest.raises(ConfigError, match=r"'router\.lan:8080' is not one"):
        config_from_dict(doc)
    env = {"ROUTER_CORS_ORIGINS": "http://a.example, http://b.example/x"}
    with pytest.raises(ConfigError, match=r"ROUTER_CORS_ORIGINS = .* overrides router\.cors_origins"):
        config_from_dict({"models": {"m": {"model": "m.gguf"}}}, env=env)
    env = {"ROUTER_CORS_ORIGINS": " http://a.example ,https://b.example", "ROUTER_ALLOWED_HOSTS": "r.lan"}
    config = config_from_dict({"models": {"m": {"model": "m.gguf"}}}, env=env).router
    assert config.cors_origins == ("http://a.example", "https://b.example")
    assert config.allowed_hosts == ("r.lan",)


def _judge(method: str, path: str, config: RouterSettings | None = None, **headers: str) -> Any:
    sent = {"host": "127.0.0.1:8080", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return judge(method, path, sent, "127.0.0.1", config or settings())


def test_judge_origins() -> None:
    assert _judge("POST", "/v1/chat/completions").refusal is None  # curl, SDKs: no Origin
    same = _judge("POST", "/v1/chat/completions", origin="http://127.0.0.1:8080")
    assert same.refusal is None and same.cors_origin is None
    foreign = _judge("POST", "/v1/chat/completions", origin=EVIL)
    assert foreign.refusal.status == 403 and foreign.refusal.code == "origin_not_allowed"
    assert EVIL in foreign.refusal.message and "cors_origins" in foreign.refusal.message
    assert _judge("GET", "/status", origin=EVIL).refusal.code == "origin_not_allowed"
    assert _judge("GET", "/health", origin=EVIL, host="evil.example").refusal is None
    assert _judge("POST", "/v1/chat/completions", origin="null").refusal.code == "origin_not_allowed"
    anything = settings(cors_origins=["*"])
    assert _judge("POST", "/x", anything, origin="null").refusal is not None  # "*" does not cover null
    assert _judge("POST", "/x", settings(cors_origins=["null"]), origin="null").cors_origin == "null"
    allowed = _judge("POST", "/v1/chat/completions", settings(cors_origins=[APP]), origin=APP)
    assert allowed.refusal is None and allowed.cors_origin == APP and not allowed.preflight
    preflight = _judge(
        "OPTIONS", "/unload", settings(cors_origins=[APP]), origin=APP, access_control_request_method="POST"
    )
    assert preflight.preflight and preflight.refusal is None


def test_judge_sec_fetch_and_admin() -> None:
    image = _judge("GET", "/upstream/alpha/props", sec_fetch_site="cross-site", sec_fetch_mode="no-cors")
    assert image.refusal.code == "cross_site_not_allowed"
    assert _judge("GET", "/chat/a/", sec_fetch_site="same-site", sec_fetch_mode="no-cors").refusal
    link = _judge(
        "GET", "/dash", sec_fetch_site="cross-site", sec_fetch_mode="navigate", sec_fetch_dest="document"
    )
    assert link.refusal is None
    assert _judge("GET", "/dash", sec_fetch_site="same-origin", sec_fetch_mode="cors").refusal is None
    assert _judge("GET", "/dash", sec_fetch_site="none", sec_fetch_mode="navigate").refusal is None
    assert _judge("GET", "/x", settings(cors_origins=["*"]), sec_fetch_site="cross-site").refusal is None
    get = _judge("GET", "/unload")
    assert get.refusal.status == 405 and get.refusal.headers == {"Allow": "POST"}
    assert _judge("POST", "/reload", content_type="text/plain").refusal.status == 415
    assert _judge("POST", "/reload").refusal.status == 415
    assert _judge("POST", "/reload", content_type="application/json; charset=utf-8").refusal is None


def test_preflight_answer_and_dropped_upstream_headers() -> None:
    answer = preflight_headers(APP, "content-type, x-stainless-os, Authorization, bad header", True)
    assert answer["Access-Control-Allow-Origin"] == APP
    allowed = [h.strip().lower() for h in answer["Access-Control-Allow-Headers"].split(",")]
    assert {"authorization", "content-type", "x-api-key", "anthropic-version", "x-stainless-os"} <= set(
        allowed
    )
    assert "bad header" not in allowed and len(allowed) == len(set(allowed))
    assert "POST" in answer["Access-Control-Allow-Methods"] and int(answer["Access-Control-Max-Age"]) > 0
    assert answer["Access-Control-Allow-Private-Network"] == "true"
    upstream = {
        "Content-Type": "application/json",
        "Access-Control-Allow-Origin": EVIL,
        "access-control-allow-credentials": "true",
        "Vary": "Origin, Accept-Encoding",
    }
    assert drop_cors(upstream) == {"Content-Type": "application/json", "Vary": "Accept-Encoding"}
    assert drop_cors({"vary": "origin"}) == {}
