"""The router's own pages (/translate, the /chat index, /talk) and their files as HTTP routes: status
codes, content types, no API key for what holds no data, the browser guard as for /dash, and the
/chat/{model}/ pass-through beside the index unchanged."""

from __future__ import annotations

import re
from pathlib import Path

from router.http.pages import ASSETS, PAGES, STATIC
from tests.support.browser import elements
from tests.support.client import assert_openai_error, chat_body
from tests.support.harness import running_router

EVIL = "http://evil.example"
FOREIGN_FRAME = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "iframe"}


async def test_pages_and_their_files_are_served_without_a_key(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {}}, router={"api_keys": ["sk-one"]}) as h:
        for path in PAGES:
            page = await h.client.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert page.headers["cache-control"] == "no-cache"
            html = page.text
            # Every script and style sheet is one of ours, by a relative URL the router serves.
            sources = [e["src"] for e in elements(html, "script")] + [
                e["href"] for e in elements(html, "link", rel="stylesheet")
            ]
            assert sources and all(not re.match(r"^(https?:)?//", s) for s in sources), sources
            for source in sources:
                asset = await h.client.get("/" + source)
                assert asset.status_code == 200, source
            links = {e["href"] for e in elements(html, "a")}
            assert {"dash", "chat", "translate"} <= links, path
        for name, content_type in ASSETS.items():
            asset = await h.client.get(f"/pages/{name}")
            assert asset.status_code == 200 and asset.headers["content-type"] == content_type
            assert asset.content == (STATIC / name).read_bytes()
        plan_js = await h.client.get("/dash/dash-plan.js")
        assert plan_js.status_code == 200 and plan_js.headers["content-type"].startswith("text/javascript")
        dash = (await h.client.get("/dash")).text
        assert {"chat", "translate"} <= {e["href"] for e in elements(dash, "a")}
        assert "dash/dash-plan.js" in [e["src"] for e in elements(dash, "script")]

        # The data the pages read still needs the key, and so does any other path.
        for path in ("/v1/models", "/status", "/plan", "/chat/a/props", "/pages/nope.js", "/chat/"):
            assert_openai_error(await h.client.get(path), 401, "invalid_api_key")
        assert_openai_error(
            await h.client.post("/v1/chat/completions", json=chat_body("a")), 401, "invalid_api_key"
        )
        assert not h.router.state.replicas


async def test_the_browser_guard_refuses_other_sites_as_for_the_dashboard(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {}}) as h:
        for path in ("/dash", *PAGES, "/pages/pages.js"):
            framed = await h.client.get(path, headers=FOREIGN_FRAME)
            assert_openai_error(framed, 403, "cross_site_not_allowed")
            foreign = await h.client.get(path, headers={"Origin": EVIL})
            assert_openai_error(foreign, 403, "origin_not_allowed")
            followed = await h.client.get(
                path,
                headers={
                    "Sec-Fetch-Site": "cross-site",
                    "Sec-Fetch-Mode": "navigate",
                    "Sec-Fetch-Dest": "document",
                },
            )
            assert followed.status_code == 200, path  # a link from another site opens the page
            assert "access-control-allow-origin" not in followed.headers
        assert_openai_error(await h.client.get("/pages/nope.js"), 404, "not_found")
        assert_openai_error(await h.client.get("/pages/dash.js"), 404, "not_found")
        slash = await h.client.get("/chat/")
        assert slash.status_code == 308 and slash.headers["location"] == "../chat"
        wrong_host = await h.client.get("/translate", headers={"Host": "evil.example"})
        assert_openai_error(wrong_host, 403, "host_not_allowed")
        own = await h.client.get("/talk", headers={"Origin": h.url, "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 200
        assert not h.router.state.replicas


async def test_the_chat_index_leaves_the_model_pass_through_as_it_was(tmp_path: Path) -> None:
    models = {"chat": {"sim": {"web_ui": True}}, "b": {}}
    async with running_router(tmp_path, models) as h:
        index = await h.client.get("/chat")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
        # A model may be called "chat": its pass-through is below /chat/chat/ as before.
        bare = await h.client.get("/chat/chat")
        assert bare.status_code == 308 and bare.headers["location"] == "chat/"
        page = await h.client.get("/chat/chat/", headers={"accept-encoding": "gzip"})
        assert page.status_code == 200 and "llama.cpp (simulated)" in page.text
        # A build without its web UI: the router's own chat page serves the model instead.
        no_ui = await h.client.get("/chat/b/")
        assert no_ui.status_code == 307 and no_ui.headers["location"] == "../../talk?model=b"
        other = await h.client.get("/chat/b/nothing-here")
        assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"
        assert_openai_error(await h.client.get("/chat/nope/"), 404, "model_not_found")
        assert (await h.client.get("/talk", params={"model": "b"})).status_code == 200
