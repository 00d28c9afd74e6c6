"""Bad client input through the real router: each case once, then the router must still serve.

Every answer is checked for the OpenAI error shape; after each, ``still_serving`` asks for /health, a
normal completion, the history (which flushes the writer, so a row it cannot write shows at once) and the
metrics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from router.http.request_body import MAX_DEPTH
from router.http.request_headers import HEADERS_LIMIT
from tests.support.client import assert_openai_error, chat_body, parse_events, post_chat
from tests.support.harness import RouterHandle, running_router

CHAT = "/v1/chat/completions"
MODELS: dict[str, dict[str, Any]] = {"a": {"sim": {"tokens": 2}}, "b": {"gpus": [1], "sim": {"tokens": 2}}}
POOLS = {"p": {"members": ["a", "b"]}}
ROUTER = {"num_gpus": 2}
JSON = {"content-type": "application/json"}


async def still_serving(h: RouterHandle) -> None:
    assert (await h.client.get("/health")).status_code == 200
    normal = await post_chat(h.client, "a", max_tokens=2)
    assert normal.status_code == 200, normal.text
    history = await h.client.get("/history", params={"limit": 5})
    assert history.status_code == 200, history.text
    assert history.json()["lost"] == 0 and history.json()["source"] == "db"
    assert (await h.client.get("/metrics")).status_code == 200


async def post_raw(h: RouterHandle, path: str, raw: bytes, **headers: str) -> httpx.Response:
    return await h.client.post(path, content=raw, headers={**JSON, **headers})


def body(**fields: Any) -> bytes:
    """A chat body; json.dumps writes a lone surrogate as its escape, as a client would send it."""
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        (CHAT, body(model="\ud800"), "model"),
        (CHAT, body(model="a", user="\udc00"), "user"),
        (CHAT, body(model="p", messages=[{"role": "user", "content": "x\ud800"}]), "messages"),
        ("/v1/embeddings", json.dumps({"model": "a", "input": "\ud83d"}).encode(), "input"),
        ("/v1/messages", json.dumps({"model": "p", "system": "\udfff", "max_tokens": 1}).encode(), "system"),
        ("/unload", json.dumps({"model": "\ud800"}).encode(), "model"),
    ],
    ids=["model", "user", "pool-messages", "embeddings-input", "messages-system", "unload"],
)
async def test_a_lone_surrogate_is_refused_where_the_body_is_parsed(
    tmp_path: Path, path: str, raw: bytes, field: str
) -> None:
    router = {**ROUTER, "default_pool": "p"}  # an unknown name would be admitted and recorded
    async with running_router(tmp_path, MODELS, pools=POOLS, router=router) as h:
        error = assert_openai_error(await post_raw(h, path, raw), 400, "invalid_json")
        assert "lone UTF-16 surrogate" in error["message"] and f"in '{field}'" in error["message"]
        await still_serving(h)


async def test_a_replica_error_quoting_a_lone_surrogate_is_recorded_and_answered(tmp_path: Path) -> None:
    """/upstream passes the body unparsed; the simulator quotes it back (as llama-server's messages do)."""
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as h:
        raw = body(tools="\ud800")
        error = assert_openai_error(await post_raw(h, "/upstream/a/v1/chat/completions", raw), 400)
        assert error["message"].startswith("Failed to parse tools: Expected 'tools' to be an array")
        await still_serving(h)
        rows = (await h.client.get("/history", params={"status": "400"})).json()["rows"]
        assert rows[0]["endpoint"] == "/upstream" and "\ufffd" in rows[0]["error"]


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (CHAT, b'{"model": "a", "x": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"),
        (CHAT, b"[" * 100_000 + b"]" * 100_000),
        ("/v1/embeddings", b'{"model": "a", "input": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001),
        ("/unload", b"[" * 3000 + b"]" * 3000),
    ],
    ids=["one-too-deep", "deeper-than-python", "embeddings-objects", "unload"],  # replicas inherit test ids
)
async def test_deep_nesting_is_refused_naming_the_limit(tmp_path: Path, path: str, raw: bytes) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as h:
        error = assert_openai_error(await post_raw(h, path, raw), 400, "invalid_json")
        assert f"more than {MAX_DEPTH} levels deep" in error["message"]
        await still_serving(h)


async def test_wrong_types_and_odd_numbers_are_refused_naming_the_field(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as h:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("/v1/embeddings", {"model": 5, "input": "x"}, "'model' must be a string"),
            ("/v1/embeddings", {"model": "a", "messages": "x"}, "'messages' must be an array of objects"),
            ("/v1/embeddings", {"model": "p", "input": 5}, "'input' must be a string, an array or an object"),
            (CHAT, {"model": "a", "messages": ["x"]}, "'messages[0]' must be an object"),
            (CHAT, {"model": "a", "messages": [], "stream": "yes"}, "'stream' must be a boolean"),
            (CHAT, {"model": "p", "messages": [], "max_tokens": [1]}, "'max_tokens' must be a number"),
            ("/unload", {"model": ["a"]}, "'model' must be a string"),
            ("/unload", {"force": "yes"}, "'force' must be a boolean"),
        ]
        for path, doc, words in cases:
            error = assert_openai_error(await h.client.post(path, json=doc), 400, "invalid_type")
            assert words in error["message"], (path, doc, error)
        for raw, words in [
            (b'{"model": "a", "max_tokens": 1e999}', "out of range"),
            (b'{"model": "a", "temperature": NaN}', "NaN is not a JSON number"),
            (b'{"model": "a", "max_tokens": ' + b"9" * 5000 + b"}", "digits"),
        ]:
            error = assert_openai_error(await post_raw(h, CHAT, raw), 400, "invalid_json")
            assert words in error["message"]
        for raw in (b"{", b"[1]", b'"x"', b"\xff"):
            assert_openai_error(await post_raw(h, "/unload", raw), 400, "invalid_json")
        huge = await h.client.post(CHAT, json=chat_body("a", max_tokens=10**30))
        assert_openai_error(huge, 400)
        objects = await h.client.post("/v1/embeddings", json={"model": "a", "input": {}})
        assert objects.status_code != 500  # llama.cpp takes {"prompt_string": ...} objects: its call
        await still_serving(h)


async def test_header_values_with_control_characters_are_refused_and_obs_text_passes(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, router={**ROUTER, "api_keys": ["k"]}) as h:
        key = {"authorization": "Bearer k"}
        for name in ("x-foo", "x-api-key", "content-type", "user-agent"):
            sent = {**key, name: "a\x01b"} if name != "x-api-key" else {"x-api-key": "k\x7f"}
            response = await h.client.post(CHAT, json=chat_body("a"), headers=sent)
            error = assert_openai_error(response, 400, "invalid_header")
            assert name in error["message"].lower()
        obs_text = await h.client.post(CHAT, json=chat_body("a"), headers={**key, "x-foo": b"caf\xe9 \xff"})
        assert obs_text.status_code == 200, obs_text.text
        odd_key = await h.client.post(CHAT, json=chat_body("a"), headers={"authorization": b"Bearer \xe9"})
        assert_openai_error(odd_key, 401, "invalid_api_key")
        big = await h.client.post(CHAT, json=chat_body("a"), headers={**key, "x-big": "a" * HEADERS_LIMIT})
        assert big.status_code == 431
        if big.content:  # h11 answers a bare 431 itself when the head arrived in pieces beyond the limit
            assert "64 KiB" in assert_openai_error(big, 431, "headers_too_large")["message"]
        h.client.headers.update(key)
        await still_serving(h)


async def test_replica_errors_reach_the_client_in_the_openai_shape(tmp_path: Path) -> None:
    models = {"a": {"sim": {"tokens": 2, "web_ui": True}}}
    async with running_router(tmp_path, models) as h:
        multipart = await post_raw(h, CHAT, body(model="a"), **{"content-type": "multipart/form-data; b=x"})
        message = assert_openai_error(multipart, 400, "upstream_error")["message"]
        assert message == "the replica of 'a' answered 400 Bad Request with an empty body"
        assert multipart.headers["x-router-model"] == "a"

        page = await h.client.get("/chat/a/", headers={"accept-encoding": "identity"})
        message = assert_openai_error(page, 415, "upstream_error")["message"]
        assert "415 Unsupported Media Type: Error: gzip is not supported" in message

        for path, raw, words in [
            (CHAT, body(model="a", tools="x"), "Failed to parse tools"),
            (CHAT, body(model="a", messages=[{"content": "no role"}]), "Failed to parse messages"),
            ("/v1/messages", json.dumps({"model": "a", "max_tokens": 2}).encode(), "'messages' is required"),
        ]:
            error = assert_openai_error(await post_raw(h, path, raw), 400, "invalid_request")
            assert error["message"].startswith(words)

        passthrough = await h.client.get("/upstream/a/nope")
        assert passthrough.json() == {
            "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
        }
        rows = (await h.client.get("/history", params={"status": "error"})).json()["rows"]
        relayed = [r["status"] for r in reversed(rows) if r["endpoint"] != "/chat"]
        assert relayed == [400, 400, 400, 400, 404]
        await still_serving(h)


async def test_a_replica_error_after_keep_alives_began_is_an_error_event(tmp_path: Path) -> None:
    models = {"a": {"sim": {"tokens": 2, "load_delay": 1.5}}}
    async with running_router(tmp_path, models) as h:
        response = await post_raw(h, CHAT, body(model="a", tools="x", stream=True))
        assert response.status_code == 200
        events, _ = parse_events(response.content, 0.0)
        (event,) = [e for e in events if e.data is not None]
        error = event.json()["error"]
        assert error["code"] == "invalid_request" and error["message"].startswith("Failed to parse tools")
        await h.wait_idle()
        await still_serving(h)


async def test_an_unexpected_exception_is_a_logged_500_with_an_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("status is broken today")

    async with running_router(tmp_path, MODELS, router=ROUTER) as h:
        monkeypatch.setattr("router.http.app.status_document", broken)
        with caplog.at_level(logging.ERROR, logger="router"):
            response = await h.client.get("/status")
        error = assert_openai_error(response, 500, "internal_error")
        ident = error["message"].split("(id ")[1].split(")")[0]
        logged = [r for r in caplog.records if f"internal error {ident}" in r.getMessage()]
        assert logged and logged[0].exc_info is not None
        assert "status is broken today" in str(logged[0].exc_info[1])
        monkeypatch.undo()
        await trio.sleep(0)
        await still_serving(h)


async def test_an_answer_sent_before_the_body_was_read_closes_the_connection(tmp_path: Path) -> None:
    """hypercorn could leave a kept-alive connection stuck after such an answer: the client's next request on
    it was never read (found by the fuzz tier: /unload, /unload refused for its key, then a completion)."""
    async with running_router(tmp_path, MODELS, router={**ROUTER, "api_keys": ["k"]}) as h:
        raw = body(model="a", input="x")
        key = {"authorization": "Bearer k"}
        refused = await post_raw(h, CHAT, raw)
        assert refused.status_code == 401 and refused.headers["connection"] == "close"
        unknown = await post_raw(h, "/nope", raw, **key)
        assert unknown.status_code == 404 and unknown.headers["connection"] == "close"
        health = await h.client.request("GET", "/health", content=raw)
        assert health.status_code == 200 and health.headers["connection"] == "close"
        served = await post_raw(h, CHAT, raw, **key)
        assert served.status_code == 200 and served.headers.get("connection") != "close"
        for _ in range(5):
            with trio.fail_after(10):
                assert (await post_raw(h, "/unload", raw, **key)).status_code == 200
                assert (await post_raw(h, "/unload", raw)).status_code == 401
                assert (await post_raw(h, "/v1/embeddings", raw, **key)).status_code == 200
        h.client.headers.update(key)
        await still_serving(h)
