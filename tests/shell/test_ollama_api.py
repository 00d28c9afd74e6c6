"""Ollama's API goes through the same admission, queue, keys, pools and history as every other route, and
answers in Ollama's shapes (simulated llama-server)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama
import trio

from tests.shell.test_history import wait_rows
from tests.support.client import chat_body, start_post, start_stream
from tests.support.harness import queued_for, running_router, serving
from tests.support.simconfig import config_document

MANY = {"tokens": 1000}
BOB = "sk-bob-0123456789"
TWO_GPUS = {"0": {"memory_mib": 8192}, "1": {"memory_mib": 8192}}


def ollama_chat(model: str, stream: bool = False, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}


async def test_a_full_queue_is_503_with_retry_after_in_ollamas_shape(tmp_path: Path) -> None:
    async with (
        running_router(tmp_path, {"a": {"sim": MANY}}, router={"queue_limit": 1}) as h,
        trio.open_nursery() as nursery,
    ):
        busy = start_stream(nursery, h.client, chat_body("a", max_tokens=30))
        await busy.first_token.wait()
        waiting = start_post(nursery, h.client, chat_body("a", max_tokens=2))
        await h.wait_state(lambda s: queued_for(s, "a") == 1)
        over = await h.client.post("/api/chat", json=ollama_chat("a"))
        assert over.status_code == 503 and int(over.headers["retry-after"]) > 0
        assert set(over.json()) == {"error"} and "queue_limit = 1" in over.json()["error"]
        await waiting.done.wait()
        await busy.done.wait()


async def test_a_client_that_leaves_a_stream_frees_its_slot_at_once(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": MANY}}) as h:
        async with h.client.stream("POST", "/api/chat", json=ollama_chat("a", stream=True)) as reply:
            assert reply.headers["content-type"] == "application/x-ndjson"
            async for line in reply.aiter_lines():
                assert json.loads(line)["message"]["role"] == "assistant"
                break
            assert h.router.state.requests
        await h.wait_state(lambda s: not s.requests)


async def test_keys_scope_what_ollama_clients_see_and_use(tmp_path: Path) -> None:
    doc = config_document(tmp_path, {"a": {"sim": {}}, "b": {"sim": {}}})
    doc["keys"] = {"bob": {"key": BOB, "models": ["a"]}}
    async with serving(tmp_path, doc) as h:
        anonymous = await h.client.get("/api/tags")
        assert anonymous.status_code == 401 and set(anonymous.json()) == {"error"}
        bob = ollama.AsyncClient(host=h.url, headers={"authorization": f"Bearer {BOB}"})
        assert [m.model for m in (await bob.list()).models] == ["a"]
        assert (await bob.chat(model="a", messages=[{"role": "user", "content": "x"}])).done
        try:
            await bob.chat(model="b", messages=[{"role": "user", "content": "x"}])
        except ollama.ResponseError as refused:
            assert refused.status_code == 403 and "keys.bob.models" in refused.error
        else:
            raise AssertionError("bob used a model outside his scope")
        unauthorised = await h.client.post("/api/chat", json=ollama_chat("a"))
        assert unauthorised.status_code == 401 and "error" in unauthorised.json()


async def test_a_page_of_another_origin_cannot_use_the_ollama_api(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": {}}}) as h:
        headers = {"origin": "https://evil.example", "content-type": "text/plain"}
        refused = await h.client.post(
            "/api/generate", content=json.dumps({"model": "a", "prompt": "x"}), headers=headers
        )
        assert refused.status_code == 403 and "evil.example" in refused.json()["error"]
        assert not h.router.state.replicas  # nothing was loaded for it


async def test_pools_history_and_usage(tmp_path: Path) -> None:
    pools = {"auto": {"members": ["a", "b"]}}  # without fallback: the first member serves it
    models = {"a": {"sim": {"tokens": 3}}, "b": {"sim": {}, "gpus": [1]}}
    async with running_router(tmp_path, models, pools=pools, devices=TWO_GPUS) as h:
        client = ollama.AsyncClient(host=h.url)
        reply = await client.generate(model="auto", prompt="hello", options={"num_predict": 3})
        assert reply.model == "auto" and reply.eval_count == 3 and reply.response
        parts = [p async for p in await client.generate(model="a", prompt="hello", stream=True)]
        assert parts[-1].done and parts[-1].eval_count == 3
        rows = await wait_rows(h.client, 2)
        assert [r["endpoint"] for r in rows] == ["/api/generate"] * 2
        assert all(
            r["status"] == 200 and r["generated_tokens"] == 3 and r["model_served"] == "a" for r in rows
        )


async def test_model_management_calls_say_where_models_come_from(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": {}}}) as h:
        client = ollama.AsyncClient(host=h.url)
        for call in (client.pull("llama3"), client.delete("a"), client.copy("a", "b")):
            try:
                await call
            except ollama.ResponseError as refused:
                assert refused.status_code == 501 and "[models.NAME]" in refused.error
            else:
                raise AssertionError("a model-management call succeeded")
        for path in ("/api/pull", "/api/create", "/api/delete", "/api/copy"):
            answer = await h.client.post(path, json={"model": "x"})
            assert answer.status_code == 501 and "[models.NAME]" in answer.json()["error"]
        wrong_method = await h.client.get("/api/chat")
        assert wrong_method.status_code == 405 and "POST" in wrong_method.json()["error"]
        unknown = await h.client.get("/api/nothing")
        assert unknown.status_code == 404 and "/api/nothing" in unknown.json()["error"]
        assert isinstance(h.client, httpx.AsyncClient)


async def test_a_replica_that_dies_answering_gives_an_error_in_ollamas_shape(tmp_path: Path) -> None:
    models = {"a": {"sim": {"tokens": 50, "crash_after_tokens": 3}}}
    async with running_router(tmp_path, models) as h:
        whole = await h.client.post("/api/chat", json=ollama_chat("a"))
        assert whole.status_code >= 500 and set(whole.json()) == {"error"}, whole.text
        streamed = await h.client.post("/api/generate", json={"model": "a", "prompt": "hi"})
        lines = [json.loads(line) for line in streamed.text.splitlines()]
        assert streamed.status_code == 200 and lines, streamed.text  # the stream had begun: its last line
        assert set(lines[-1]) == {"error"} and all(not line.get("done") for line in lines)
