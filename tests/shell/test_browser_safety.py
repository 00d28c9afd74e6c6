"""Browser safety: pages on other origins, rebound host names and admin actions (router.http.browser_guard).

The rules are checked three ways: as pure functions; against a running router with crafted ``Origin``,
``Host`` and ``Sec-Fetch-*`` headers, where the simulated replica (which reflects ``Origin`` like
llama-server) must never see a refused request; and in headless Chromium, where a page served from another
origin tries to read a completion and to unload the models.

The Chromium tests skip without a browser unless ``LLAMA_ROUTER_REQUIRE_BROWSER=1`` (see
tests/browser/test_dash_browser.py).
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

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
from tests.browser.test_dash_browser import chromium, find_browser
from tests.support.harness import RouterHandle, assert_openai_error, chat_body, running_router, stream
from tests.support.simtools import read_records

MODELS: Mapping[str, Mapping[str, Any]] = {"alpha": {"sim": {"tokens": 4}}}
EVIL = "http://evil.example"
APP = "http://localhost:3000"


def settings(**changes: Any) -> RouterSettings:
    """[router] settings as the loader makes them (canonical origins and host names)."""
    doc = {"router": dict(changes), "models": {"m": {"model": "m.gguf"}}}
    return config_from_dict(doc).router


# ------------------------------------------------------------------------------------------ pure rules


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


# -------------------------------------------------------------------------------- against a live router


def request_lines(h: RouterHandle, path: str) -> int:
    """How many requests for ``path`` the replicas logged (the simulator logs each one it answers)."""
    return sum(
        1
        for replica in h.router.state.replicas
        for line in h.router.supervisor.logs(replica.id)
        if f"request: POST {path} " in line
    )


def replicas_now(h: RouterHandle) -> list[tuple[int, str]]:
    return [(r.id, r.phase) for r in h.router.state.replicas]


async def wait_lines(h: RouterHandle, path: str, count: int) -> None:
    with trio.fail_after(5):
        while request_lines(h, path) < count:
            await trio.sleep(0.02)


def edit_config(h: RouterHandle, **aliases: list[str]) -> None:
    path = h.dir / "router.json"
    doc = json.loads(path.read_text())
    for model, names in aliases.items():
        doc["models"][model]["aliases"] = names
    path.write_text(json.dumps(doc))


async def test_a_foreign_origin_reaches_no_replica_and_no_admin_action(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS) as h:
        foreign = {"Origin": EVIL}
        body = json.dumps(chat_body("alpha"))
        for headers in (foreign, {**foreign, "Content-Type": "text/plain"}):
            refused = await h.client.post("/v1/chat/completions", content=body, headers=headers)
            error = assert_openai_error(refused, 403, "origin_not_allowed")
            assert EVIL in error["message"] and "cors_origins" in error["message"]
            assert "access-control-allow-origin" not in refused.headers
        streamed = await stream(h.client, "/v1/chat/completions", chat_body("alpha"), headers=foreign)
        assert streamed.status == 403 and not streamed.events
        for path in ("/status", "/history", "/v1/models", "/upstream/alpha/props", "/chat/alpha/props"):
            read = await h.client.get(path, headers=foreign)
            assert_openai_error(read, 403, "origin_not_allowed")
            assert "access-control-allow-origin" not in read.headers
        sandboxed = await h.client.post("/v1/chat/completions", content=body, headers={"Origin": "null"})
        assert_openai_error(sandboxed, 403, "origin_not_allowed")
        image = await h.client.get(
            "/upstream/alpha/props", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
        )
        assert_openai_error(image, 403, "cross_site_not_allowed")
        # Nothing was loaded: no replica ever started.
        assert not h.router.state.replicas and read_records(h.records_of("alpha")) == []

        # Now with alpha loaded: a foreign page can neither reach it nor unload it nor reload the config.
        assert (await h.client.post("/v1/chat/completions", json=chat_body("alpha"))).status_code == 200
        await wait_lines(h, "/v1/chat/completions", 1)
        (replica,) = h.router.state.replicas
        refused = await h.client.post("/v1/chat/completions", content=body, headers=foreign)
        assert_openai_error(refused, 403, "origin_not_allowed")
        for path in ("/unload", "/reload"):
            assert_openai_error(
                await h.client.post(path, json={}, headers=foreign), 403, "origin_not_allowed"
            )
        edit_config(h, alpha=["renamed"])
        refused_reload = await h.client.post("/reload", json={}, headers={"Origin": "http://localhost:8080"})
        assert_openai_error(refused_reload, 403, "origin_not_allowed")  # localhost:8080 is another port
        await trio.sleep(0.3)
        assert replicas_now(h) == [(replica.id, "ready")]
        assert request_lines(h, "/v1/chat/completions") == 1
        assert h.router.config.models["alpha"].aliases == ()
        statuses = [r["status"] for r in (await h.client.get("/history")).json()["rows"]]
        assert statuses.count(200) == 1 and set(statuses) == {200, 403}, statuses


async def test_the_routers_own_origin_is_served(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS) as h:
        port = h.config.router.port
        for origin, host in ((h.url, None), (f"http://localhost:{port}", f"localhost:{port}")):
            headers = {"Origin": origin, **({"Host": host} if host else {})}
            reply = await h.client.post("/v1/chat/completions", json=chat_body("alpha"), headers=headers)
            assert reply.status_code == 200, reply.text
            assert not [k for k in reply.headers if k.lower().startswith("access-control-")]
        own = {"Origin": h.url, "Sec-Fetch-Site": "same-origin"}
        edit_config(h, alpha=["renamed"])
        assert (await h.client.post("/reload", json={}, headers=own)).status_code == 200
        assert h.router.config.models["alpha"].aliases == ("renamed",)
        unloaded = await h.client.post("/unload", json={}, headers=own)
        assert unloaded.status_code == 200 and unloaded.json()["unloaded"] == "all"


async def test_an_allowed_origin_gets_cors_and_the_replicas_policy_never_passes(tmp_path: Path) -> None:
    router = {"cors_origins": [APP], "api_keys": ["sk-one"]}
    async with running_router(tmp_path, MODELS, router=router) as h:
        key = {"Authorization": "Bearer sk-one"}
        # Straight to the replica, a foreign Origin is reflected, as llama-server does.
        assert (await h.client.post("/v1/chat/completions", json=chat_body("alpha"), headers=key)).is_success
        (replica,) = h.router.state.replicas
        info = h.router.supervisor.info(replica.id)
        assert info is not None
        port = info.port
        async with httpx.AsyncClient() as direct:
            raw = await direct.get(f"http://127.0.0.1:{port}/props", headers={"Origin": EVIL})
        assert raw.headers["access-control-allow-origin"] == EVIL

        preflight = await h.client.options(
            "/v1/chat/completions",
            headers={
                "Origin": APP,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
            },
        )
        assert preflight.status_code == 204, preflight.text
        assert preflight.headers["access-control-allow-origin"] == APP
        allowed = preflight.headers["access-control-allow-headers"].lower()
        for name in ("authorization", "content-type", "x-api-key", "anthropic-version", "x-stainless-os"):
            assert name in allowed
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert int(preflight.headers["access-control-max-age"]) > 0

        reply = await h.client.post(
            "/v1/chat/completions", json=chat_body("alpha"), headers={**key, "Origin": APP}
        )
        assert reply.status_code == 200
        assert reply.headers.get_list("access-control-allow-origin") == [APP]
        assert "access-control-allow-credentials" not in reply.headers
        assert [v.strip() for v in reply.headers["vary"].split(",")].count("Origin") == 1
        streamed = await stream(
            h.client, "/v1/chat/completions", chat_body("alpha"), headers={**key, "Origin": APP}
        )
        assert streamed.done and streamed.headers.get_list("access-control-allow-origin") == [APP]
        for path in ("/upstream/alpha/props", "/chat/alpha/props"):
            passed = await h.client.get(path, headers={**key, "Origin": APP})
            assert passed.status_code == 200 and passed.headers.get_list("access-control-allow-origin") == [
                APP
            ]
            assert "access-control-allow-credentials" not in passed.headers
            plain = await h.client.get(path, headers=key)  # no Origin: the replica's "*" is dropped as well
            assert not [k for k in plain.headers if k.lower().startswith("access-control-")]
        no_key = await h.client.post("/v1/chat/completions", json=chat_body("alpha"), headers={"Origin": APP})
        assert_openai_error(no_key, 401, "invalid_api_key")
        assert no_key.headers["access-control-allow-origin"] == APP  # the page can read why
        other = await h.client.options(
            "/v1/chat/completions",
            headers={"Origin": "http://localhost:3001", "Access-Control-Request-Method": "POST"},
        )
        assert_openai_error(other, 403, "origin_not_allowed")


async def test_host_names_other_than_loopback_are_refused(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS) as h:
        port = h.config.router.port
        rebound = {"Host": f"evil.example:{port}"}
        refused = await h.client.post("/v1/chat/completions", json=chat_body("alpha"), headers=rebound)
        error = assert_openai_error(refused, 403, "host_not_allowed")
        assert "evil.example" in error["message"] and "allowed_hosts" in error["message"]
        same_origin_too = {**rebound, "Origin": f"http://evil.example:{port}"}
        assert_openai_error(await h.client.post("/unload", json={}, headers=same_origin_too), 403)
        assert_openai_error(await h.client.get("/status", headers=rebound), 403, "host_not_allowed")
        assert (await h.client.get("/health", headers=rebound)).status_code == 200
        assert not h.router.state.replicas and read_records(h.records_of("alpha")) == []
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "app.localhost"):
            assert (await h.client.get("/v1/models", headers={"Host": host})).status_code == 200, host


async def test_allowed_hosts_are_honoured(tmp_path: Path) -> None:
    async with running_router(
        tmp_path, MODELS, router={"allowed_hosts": ["router.lan", ".example.lan"]}
    ) as h:
        for host in ("router.lan:9000", "a.example.lan", "localhost"):
            assert (await h.client.get("/v1/models", headers={"Host": host})).status_code == 200, host
        assert_openai_error(await h.client.get("/v1/models", headers={"Host": "evil.example"}), 403)


async def test_admin_actions_need_post_with_json(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS) as h:
        for path in ("/unload", "/reload"):
            got = await h.client.get(path)
            error = assert_openai_error(got, 405, "method_not_allowed")
            assert got.headers["allow"] == "POST" and "application/json" in error["message"]
            plain = await h.client.post(path, content=b"{}", headers={"Content-Type": "text/plain"})
            error = assert_openai_error(plain, 415, "unsupported_media_type")
            assert "text/plain" in error["message"]
            assert_openai_error(await h.client.post(path), 415, "unsupported_media_type")
        form = await h.client.post("/unload", data={"model": "alpha"})
        assert_openai_error(form, 415, "unsupported_media_type")
        assert (await h.client.post("/v1/chat/completions", json=chat_body("alpha"))).status_code == 200
        charset = {"Content-Type": "application/json; charset=utf-8"}
        done = await h.client.post("/unload", content=b'{"model": "alpha"}', headers=charset)
        assert done.status_code == 200 and done.json()["unloaded"] == "alpha"


# ------------------------------------------------------------------------------------------- in Chromium

ATTACK = """<!doctype html>
<html><head><title>waiting</title></head><body><pre id="out"></pre>
<script>
const ROUTER = "%ROUTER%";
const results = {};
async function attempt(name, path, init) {
  try {
    const response = await fetch(ROUTER + path, init);
    results[name] = {status: response.status, body: (await response.text()).slice(0, 4000)};
  } catch (error) {
    results[name] = {error: String(error)};
  }
}
const chat = JSON.stringify({model: "alpha", messages: [{role: "user", content: "what is secret"}]});
const plain = {"Content-Type": "text/plain"};
const typed = {"Content-Type": "application/json"};
(async () => {
  await attempt("chat", "/v1/chat/completions", {method: "POST", headers: plain, body: chat});
  await attempt("chat_no_cors", "/v1/chat/completions", {method: "POST", mode: "no-cors", headers: plain,
                                                         body: chat});
  await attempt("status", "/status", {});
  await attempt("unload_plain", "/unload", {method: "POST", headers: plain, body: "{}"});
  await attempt("unload_no_cors", "/unload", {method: "POST", mode: "no-cors", headers: plain, body: "{}"});
  await attempt("unload_json", "/unload", {method: "POST", headers: typed, body: "{}"});
  document.getElementById("out").textContent = JSON.stringify(results);
  document.title = "done";
})();
</script></body></html>
"""


@contextlib.contextmanager
def other_origin(page: list[str]) -> Iterator[str]:
    """Serve ``page[0]`` (filled in later) from a second loopback port: another origin to the browser."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def run_page(browser: str, url: str) -> dict[str, Any]:
    """Load ``url`` in Chromium until its script is done; what it recorded."""
    dom = (await chromium(browser, "--virtual-time-budget=8000", "--dump-dom", url)).decode()
    assert "<title>done</title>" in dom, dom[-2000:]
    found = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    assert found is not None, dom[-2000:]
    return dict(json.loads(html.unescape(found.group(1))))


async def test_chromium_a_page_on_another_origin_cannot_use_the_router(tmp_path: Path) -> None:
    browser = find_browser()
    page = [""]
    with other_origin(page) as attacker:
        async with running_router(tmp_path, MODELS) as h:
            page[0] = ATTACK.replace("%ROUTER%", h.url)
            assert (await h.client.post("/v1/chat/completions", json=chat_body("alpha"))).status_code == 200
            await wait_lines(h, "/v1/chat/completions", 1)
            (replica,) = h.router.state.replicas
            results = await run_page(browser, attacker)
            await trio.sleep(0.3)
            assert replicas_now(h) == [(replica.id, "ready")]
            assert request_lines(h, "/v1/chat/completions") == 1
            rows = (await h.client.get("/history")).json()["rows"]

    # Every read failed in the browser; the requests sent anyway (no-cors) were refused by the router.
    for name in ("chat", "status", "unload_plain", "unload_json"):
        assert "error" in results[name], (name, results)
    assert results["chat_no_cors"] == {"status": 0, "body": ""}
    assert results["unload_no_cors"] == {"status": 0, "body": ""}
    # Both chat attempts did arrive (so the browser itself did not stop them) and got 403.
    assert sorted(r["status"] for r in rows) == [200, 403, 403]


async def test_chromium_an_origin_in_cors_origins_can_use_the_router(tmp_path: Path) -> None:
    browser = find_browser()
    page = [""]
    with other_origin(page) as app_origin:
        async with running_router(tmp_path, MODELS, router={"cors_origins": [app_origin]}) as h:
            page[0] = ATTACK.replace("%ROUTER%", h.url)
            results = await run_page(browser, app_origin)
            await h.wait_state(lambda s: not s.replicas)  # unload_json unloaded everything
            rows = (await h.client.get("/history")).json()["rows"]

    assert results["chat"]["status"] == 200, results
    assert "tok" in json.loads(results["chat"]["body"])["choices"][0]["message"]["content"]
    assert results["status"]["status"] == 200
    assert results["unload_plain"]["status"] == 415 and "application/json" in results["unload_plain"]["body"]
    assert results["unload_json"]["status"] == 200 and '"unloaded": "all"' in results["unload_json"]["body"]
    served = [(r["endpoint"], r["status"], r["model_served"]) for r in rows]
    assert ("/v1/chat/completions", 200, "alpha") in served, served


async def test_chromium_a_rebound_host_name_is_refused(tmp_path: Path) -> None:
    browser = find_browser()
    async with running_router(tmp_path, MODELS) as h:
        port = h.config.router.port
        rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
        dom = (await chromium(browser, rules, "--dump-dom", f"http://evil.example:{port}/status")).decode()
        own = (await chromium(browser, "--dump-dom", f"http://localhost:{port}/status")).decode()
    assert "host_not_allowed" in dom and '"queue"' not in dom
    assert '"queue"' in own
