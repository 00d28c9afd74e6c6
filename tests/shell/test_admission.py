"""Admission (router.http.admission) as every entry point applies it: with API keys set, every page and
every file a page names opens without a key (they hold no data and ask for the key themselves), while the
API, the JSON documents and the admin actions need one."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.support.client import assert_openai_error, chat_body
from tests.support.harness import running_router
from tests.support.installed import crawl

KEY = "sk-admission"


async def test_with_keys_the_pages_and_their_files_open_and_the_rest_needs_the_key(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"m": {}}, router={"api_keys": [KEY]}) as h:
        visit = await trio.to_thread.run_sync(crawl, h.url)
        refused = visit.failures()
        # The pages' links to the JSON documents need the key; the pages and their files do not.
        assert refused and all(status == 401 for status in refused.values()), refused
        files = [u for u in visit.assets() if "/dash/" in u or "/pages/" in u]
        assert len(files) >= 8 and not set(files) & set(refused), refused
        assert any(u.endswith("/dash/dash-rpc.js") for u in files)
        for path in ("/status", "/v1/models", "/metrics", "/history", "/plan"):
            assert_openai_error(await h.client.get(path), 401, "invalid_api_key")
        assert_openai_error(await h.client.post("/v1/chat/completions", json=chat_body("m")), 401)
        assert_openai_error(await h.client.post("/unload", json={}), 401, "invalid_api_key")
        keyed = {"Authorization": f"Bearer {KEY}"}
        assert (
            await h.client.post("/v1/chat/completions", json=chat_body("m"), headers=keyed)
        ).status_code == 200
        assert (await h.client.get("/status", headers=keyed)).status_code == 200
