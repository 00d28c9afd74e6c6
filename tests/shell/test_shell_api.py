"""The router's HTTP surface: OpenAI-shaped errors, /v1/models (and /v1/models/{id}), /status, /upstream,
/unload, keep-alive."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from statemachine.queries import replicas_of
from tests.support.client import assert_openai_error, chat_body, post_chat, start_post, start_stream, stream
from tests.support.harness import RouterHandle, queued_for, running_router
from tests.support.routerproc import wait_pid_gone
from tests.support.simtools import read_records

MANY = {"tokens": 1000}


async def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    async with (
        running_router(tmp_path, {"a": {"sim": MANY}}, router={"queue_limit": 1}) as h,
        trio.open_nursery() as nursery,
    ):
        busy = start_stream(nursery, h.client, chat_body("a", max_tokens=30))
        await busy.first_token.wait()
        waiting = start_post(nursery, h.client, chat_body("a", max_tokens=2))
        await h.wait_state(lambda s: queued_for(s, "a") == 1)
        over = await post_chat(h.client, "a", max_tokens=2)
        error = assert_openai_error(over, 503, "queue_full")
        assert "queue_limit = 1" in error["message"]
        assert int(over.headers["retry-after"]) > 0
        streamed_over = await stream(h.client, "/v1/chat/completions", chat_body("a", max_tokens=2))
        assert streamed_over.status == 503
        assert json.loads(streamed_over.body)["error"]["code"] == "queue_full"
        await waiting.done.wait()
        await busy.done.wait()
    assert waiting.response is not None and waiting.response.status_code == 200
    assert busy.stream.done


async def test_bad_requests_get_openai_shaped_errors(tmp_path: Path) -> None:
    models = {"a": {"sim": {}}, "b": {"sim": {}}}
    async with running_router(tmp_path, models, router={"max_body_mib": 1}) as h:
        headers = {"content-type": "application/json"}
        broken = await h.client.post("/v1/chat/completions", content=b'{"model": "a", ', headers=headers)
        assert "not valid JSON" in assert_openai_error(broken, 400, "invalid_json")["message"]

        not_object = await h.client.post("/v1/chat/completions", json=["a"])
        assert_openai_error(not_object, 400, "invalid_json")

        nameless = await h.client.post("/v1/chat/completions", json={"messages": []})
        assert_openai_error(nameless, 400, "model_required")

        unknown = await post_chat(h.client, "nope")
        message = assert_openai_error(unknown, 404, "model_not_found")["message"]
        assert "'nope'" in message and "a, b" in message

        big = chat_body("a", text="word " * (300 * 1024))  # about 1.5 MiB
        too_large = await h.client.post("/v1/chat/completions", json=big)
        error = assert_openai_error(too_large, 413)
        assert "max_body_mib = 1" in error["message"]

        unknown_upstream = await h.client.get("/upstream/nope/props")
        assert_openai_error(unknown_upstream, 404, "model_not_found")
        unknown_unload = await h.client.post("/unload", json={"model": "nope"})
        assert_openai_error(unknown_unload, 404, "model_not_found")
        # None of these started a replica.
        assert h.router.state.replicas == ()
        assert read_records(h.records) == []


async def test_models_list_shows_state_gpus_aliases_and_pricing(tmp_path: Path) -> None:
    models = {
        "a": {
            "aliases": ["alpha", "first"],
            "pricing": {"input": 0.5, "output": 1.5},
            "parallel": 2,
            "sim": {"load_delay": 1.0},
        },
        "b": {"gpus": [1], "sim": {}},
    }
    async with (
        running_router(tmp_path, models, router={"num_gpus": 2}) as h,
        trio.open_nursery() as nursery,
    ):
        before = {m["id"]: m for m in (await h.models())["data"]}
        assert before["a"]["state"] == before["b"]["state"] == "unloaded"
        assert before["a"]["gpus"] == [0] and before["b"]["gpus"] == [1]
        assert before["a"]["aliases"] == ["alpha", "first"]
        assert before["a"]["pricing"] == {"input": 0.5, "output": 1.5}
        assert "pricing" not in before["b"]
        assert before["a"]["object"] == "model" and before["a"]["parallel"] == 2

        pending = start_post(nursery, h.client, chat_body("alpha", max_tokens=2))
        await h.wait_state(lambda s: any(r.phase == "loading" for r in replicas_of(s, "a")))
        during = {m["id"]: m for m in (await h.models())["data"]}
        assert during["a"]["state"] == "loading"
        await pending.done.wait()
        after = {m["id"]: m for m in (await h.models())["data"]}
        plain = {m["id"]: m["state"] for m in (await h.client.get("/models")).json()["data"]}
    assert pending.response is not None and pending.response.status_code == 200
    assert pending.response.headers["x-router-model"] == "a"
    assert after["a"]["state"] == "ready" and after["b"]["state"] == "unloaded"
    assert plain == {"a": "ready", "alpha": "ready", "first": "ready", "b": "unloaded"}


async def test_one_model_or_pool_by_id_or_alias(tmp_path: Path) -> None:
    models = {"a": {"aliases": ["alpha"], "pricing": {"input": 0.5}, "sim": {}}, "b": {"sim": {}}}
    pools = {"both": {"members": ["a", "b"], "aliases": ["auto"]}}
    async with running_router(tmp_path, models, pools=pools) as h:
        listed = {m["id"]: m for m in (await h.models())["data"]}
        assert listed["alpha"]["alias_of"] == "a" and listed["auto"]["alias_of"] == "both"
        for asked in ("a", "alpha", "both", "auto"):  # an alias answers with its own entry
            reply = await h.client.get(f"/v1/models/{asked}")
            assert reply.status_code == 200, reply.text
            one = reply.json()
            assert one == {**listed[asked], "created": one["created"]}, asked
        assert (await h.client.get("/models/alpha")).json()["alias_of"] == "a"
        assert (await h.client.get("/v1/models/both")).json()["pool"] == ["a", "b"]

        unknown = await h.client.get("/v1/models/nope")
        message = assert_openai_error(unknown, 404, "model_not_found")["message"]
        assert "'nope'" in message and "a, b, both" in message
        nested = await h.client.get("/v1/models/org/nope")
        assert "'org/nope'" in assert_openai_error(nested, 404, "model_not_found")["message"]
        assert h.router.state.replicas == ()  # looking does not load anything


async def test_status_shows_queue_residency_replicas_and_recent_events(tmp_path: Path) -> None:
    models = {"a": {"sim": MANY}, "b": {"sim": MANY}}
    async with (
        running_router(tmp_path, models, router={"max_models_per_gpu": 1}) as h,
        trio.open_nursery() as nursery,
    ):
        busy = start_stream(nursery, h.client, chat_body("a", max_tokens=40))
        await busy.first_token.wait()
        waiting = start_post(nursery, h.client, chat_body("b", max_tokens=2))
        await h.wait_state(lambda s: queued_for(s, "b") == 1)
        during = await h.status()
        await waiting.done.wait()
        await busy.done.wait()
        after = await h.status()

    (queued,) = during["queue"]
    assert queued["target"] == "b" and queued["age_s"] >= 0
    assert queued["key"] is None and queued["class"] == "standard"  # no keys configured: anonymous
    assert during["gpus"][0]["residents"] == ["a"]
    (replica,) = during["replicas"]
    (record,) = read_records(h.records_of("a"))
    assert replica["model"] == "a" and replica["state"] == "ready"
    assert replica["in_flight"] == 1 and replica["slots"] == 1
    assert replica["pid"] == record["pid"] and replica["port"] == record["port"]
    assert during["shutting_down"] is False

    assert after["queue"] == []
    assert after["gpus"][0]["residents"] == ["b"]
    recent = [(x["kind"], x["model"]) for x in reversed(after["recent"])]
    assert recent[:2] == [("load", "a"), ("ready", "a")]
    assert ("stop", "a") in recent and ("exited", "a") in recent and ("load", "b") in recent
    assert recent.index(("stop", "a")) < recent.index(("load", "b"))
    stop = next(x for x in after["recent"] if x["kind"] == "stop")
    assert "evicted" in stop["reason"] and "'b'" in stop["reason"]
    load = next(x for x in after["recent"] if x["kind"] == "load" and x["model"] == "a")
    assert "request" in load["reason"]


async def _raw_get(h: RouterHandle, target: str) -> int:
    """GET a request target exactly as written (no client-side path normalisation); the status."""
    port = h.config.router.port
    stream_ = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream_:
        head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        await stream_.send_all(head.encode())
        data = b""
        while b"\r\n" not in data:
            chunk = await stream_.receive_some(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


async def test_upstream_passes_through_and_rejects_escapes(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"parallel": 3, "sim": {}}}) as h:
        props = await h.client.get("/upstream/a/props")
        assert props.status_code == 200
        assert props.json()["total_slots"] == 3
        assert props.json()["model_path"].endswith("a.json")
        slots = await h.client.get("/upstream/a/slots")
        assert slots.status_code == 200 and len(slots.json()) == 3
        tokens = await h.client.post("/upstream/a/tokenize", json={"content": "one two three"})
        assert tokens.status_code == 200 and len(tokens.json()["tokens"]) == 3

        encoded = await h.client.get("/upstream/a/%2e%2e/props")
        assert_openai_error(encoded, 400, "invalid_path")
        assert await _raw_get(h, "/upstream/a/../props") in (400, 404)
        assert await _raw_get(h, "/upstream/a/slots/../../b/props") in (400, 404)
        dot = await h.client.get("/upstream/a/%2e/props")
        assert_openai_error(dot, 400, "invalid_path")


async def test_unload_waits_for_in_flight_work(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": MANY}}) as h, trio.open_nursery() as nursery:
        busy = start_stream(nursery, h.client, chat_body("a", max_tokens=40))
        await busy.first_token.wait()
        asked = trio.current_time()
        response = await h.client.post("/unload", json={"model": "a"})
        answered = trio.current_time()
        await busy.done.wait()
        assert response.status_code == 200
        assert response.json() == {"unloaded": "a", "forced": False, "replicas": [1], "waited": True}
        assert replicas_of(h.router.state, "a") == [] or all(
            r.phase == "stopping" for r in replicas_of(h.router.state, "a")
        )
    reply = busy.stream
    assert reply.done and not reply.errors
    assert asked < reply.last_token_at <= answered


async def test_forced_unload_stops_at_once(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": MANY}}) as h, trio.open_nursery() as nursery:
        busy = start_stream(nursery, h.client, chat_body("a", max_tokens=300))
        await busy.first_token.wait()
        response = await h.client.post("/unload", json={"model": "a", "force": True})
        await busy.done.wait()
        await h.wait_state(lambda s: not replicas_of(s, "a"))
        (record,) = read_records(h.records_of("a"))
    expected = {"unloaded": "a", "forced": True, "replicas": [1], "waited": True}
    assert response.status_code == 200 and response.json() == expected
    reply = busy.stream
    assert not reply.done and len(reply.errors) == 1
    assert len(reply.tokens) < 200  # cut: the stream had 300 tokens to send
    stop = next(x for x in h.router.happenings if x.kind == "stop")
    assert "forced" in stop.reason
    await wait_pid_gone(record["pid"])


async def test_unload_of_everything(tmp_path: Path) -> None:
    models = {"a": {"sim": {}}, "b": {"gpus": [1], "sim": {}}}
    async with running_router(tmp_path, models, router={"num_gpus": 2}) as h:
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        assert (await post_chat(h.client, "b", max_tokens=1)).status_code == 200
        response = await h.client.post("/unload", json={})
        assert response.status_code == 200 and response.json()["unloaded"] == "all"
        await h.wait_state(lambda s: not s.replicas)
        states = {m["id"]: m["state"] for m in (await h.models())["data"]}
        assert states == {"a": "unloaded", "b": "unloaded"}


async def test_a_stream_waiting_for_a_slow_load_gets_keepalive_comments(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": {"load_delay": 3.0}}}) as h:
        reply = await stream(h.client, "/v1/chat/completions", chat_body("a", max_tokens=3))
    assert reply.status == 200 and reply.done and not reply.errors
    early = [c for c in reply.comments if c.at < reply.first_token_at]
    assert early, reply.events
    assert "waiting for 'a'" in early[0].comment  # type: ignore[operator]
    assert any("loading a" in (c.comment or "") for c in early)
    assert reply.text() == " tok0 tok1 tok2"
