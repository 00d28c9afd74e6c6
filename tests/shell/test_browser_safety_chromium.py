"""Browser safety in headless Chromium: a page served from another origin tries to read a completion and
to unload the models; a page on an origin in ``cors_origins`` may.

These tests skip without a browser unless ``LLAMA_ROUTER_REQUIRE_BROWSER=1`` (see
tests/browser/test_dash_browser.py).
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.shell.browser_safety_common import (
    MODELS,
    allowed_chat_after,
    replicas_now,
    request_lines,
    wait_lines,
)
from tests.support.browser import chromium, find_browser
from tests.support.client import chat_body
from tests.support.harness import running_router

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
            await allowed_chat_after(h)
            assert replicas_now(h) == [(replica.id, "ready")]
            assert request_lines(h, "/v1/chat/completions") == 2  # the first and the one after
            rows = (await h.client.get("/history")).json()["rows"]

    # Every read failed in the browser; the requests sent anyway (no-cors) were refused by the router.
    for name in ("chat", "status", "unload_plain", "unload_json"):
        assert "error" in results[name], (name, results)
    assert results["chat_no_cors"] == {"status": 0, "body": ""}
    assert results["unload_no_cors"] == {"status": 0, "body": ""}
    # Both chat attempts did arrive (so the browser itself did not stop them) and got 403.
    assert sorted(r["status"] for r in rows) == [200, 200, 403, 403]


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
