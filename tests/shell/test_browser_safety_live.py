"""Browser safety against a running router: crafted ``Origin``, ``Host`` and ``Sec-Fetch-*`` headers, where
the simulated replica (which reflects ``Origin`` like llama-server) must never see a refused request.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.shell.browser_safety_common import (
    APP,
    EVIL,
    MODELS,
    allowed_chat_after,
    replicas_now,
    request_lines,
    wait_lines,
)
from tests.support.client import assert_openai_error, chat_body, stream
from tests.support.harness import RouterHandle, running_router
from tests.support.simtools import read_records


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
        await allowed_chat_after(h)
        assert replicas_now(h) == [(replica.id, "ready")]
        assert request_lines(h, "/v1/chat/completions") == 2  # the first and the one after
        assert h.router.config.models["alpha"].aliases == ()
        statuses = [r["status"] for r in (await h.client.get("/history")).json()["rows"]]
        assert statuses.count(200) == 2 and set(statuses) == {200, 403}, statuses


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
