"""Ollama's official Python client and langchain-ollama, unmodified, against the router in front of the real
llama-server: every Ollama endpoint the router serves, streaming and not."""

from __future__ import annotations

import json
import math
from pathlib import Path

import ollama
import pytest
import trio

from tests.support.realharness import real_router

pytestmark = pytest.mark.real

MODELS = {
    "m": {"aliases": ["m-alias"], "parallel": 2},
    "e": {"embeddings": True, "pooling": "mean", "shape": "other"},
}
POOLS = {"auto": {"members": ["m"]}}


def client_of(url: str) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=url, timeout=120)


async def test_chat_and_generate_through_the_official_client(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS, pools=POOLS) as rt:
        client = client_of(rt.url)
        options = {"num_predict": 5, "temperature": 0.0}
        reply = await client.chat(model="m", messages=[{"role": "user", "content": "Hello"}], options=options)
        assert reply.message.role == "assistant" and reply.message.content
        assert reply.done and reply.done_reason == "length" and reply.model == "m"
        assert reply.eval_count == 5 and reply.prompt_eval_count and reply.prompt_eval_count > 0
        assert reply.total_duration and reply.eval_duration and reply.eval_duration > 0

        lines = [
            part
            async for part in await client.chat(
                model="m-alias", messages=[{"role": "user", "content": "Hi"}], options=options, stream=True
            )
        ]
        assert all(p.message.role == "assistant" for p in lines)
        assert [p.done for p in lines] == [False] * (len(lines) - 1) + [True]
        assert lines[-1].eval_count == 5 and lines[-1].model == "m-alias"
        assert "".join(p.message.content or "" for p in lines)

        generated = await client.generate(model="auto", prompt="Once", system="Be brief.", options=options)
        assert (
            generated.done and generated.eval_count == 5 and generated.response and generated.model == "auto"
        )
        raw = [
            p
            async for p in await client.generate(
                model="m", prompt="Once", raw=True, options=options, stream=True
            )
        ]
        assert raw[-1].done and raw[-1].eval_count == 5 and "".join(p.response or "" for p in raw)

        # format reaches llama-server as a JSON grammar, which the tiny model's vocabulary cannot build: its
        # refusal (a sampler that fails to start) shows the schema arrived; without it the call succeeds.
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        for form in ("json", schema):
            with pytest.raises(ollama.ResponseError) as refused:
                await client.chat(model="m", messages=[{"role": "user", "content": "JSON"}], format=form)
            assert refused.value.status_code == 400 and "samplers" in refused.value.error

        tools = [
            {"type": "function", "function": {"name": "now", "description": "the time", "parameters": {}}}
        ]
        with_tools = await client.chat(
            model="m", messages=[{"role": "user", "content": "time?"}], tools=tools, options=options
        )
        assert with_tools.done


async def test_models_load_unload_and_describe_themselves(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS, pools=POOLS) as rt:
        client = client_of(rt.url)
        listed = await client.list()
        by_name = {m.model: m for m in listed.models}
        assert set(by_name) == {"m", "e", "auto", "m-alias"}
        assert by_name["m"].details is not None and by_name["m"].details.format == "gguf"
        assert by_name["m"].details.family == "llama" and by_name["m"].size and by_name["m"].size > 0
        assert (await client.ps()).models == []

        loaded = await client.generate(model="m", prompt="")
        assert loaded.done and loaded.done_reason == "load"
        running = (await client.ps()).models
        assert [p.model for p in running] == ["m"]
        assert running[0].size_vram is not None and running[0].context_length == 1024  # 2048 over 2 slots

        shown = await client.show("m-alias")
        assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
        assert shown.capabilities is not None and "completion" in shown.capabilities
        assert shown.details is not None and shown.details.quantization_level
        assert "num_ctx 1024" in (shown.parameters or "")

        version = await rt.client.get("/api/version")
        assert version.status_code == 200 and version.json()["version"]

        unloaded = await client.generate(model="m", prompt="", keep_alive=0)
        assert unloaded.done_reason == "unload"

        await rt.wait_state(lambda s: not s.replicas, timeout=30)


async def test_embeddings_through_the_official_client(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS) as rt:
        client = client_of(rt.url)
        embedded = await client.embed(model="e", input=["one", "two"])
        assert len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) == 64
        assert embedded.model == "e" and embedded.prompt_eval_count
        short = await client.embed(model="e", input="one", dimensions=8)
        assert len(short.embeddings[0]) == 8
        assert math.isclose(math.hypot(*short.embeddings[0]), 1.0, rel_tol=1e-5)
        legacy = await client.embeddings(model="e", prompt="one")
        assert len(legacy.embedding) == 64


async def test_errors_reach_the_client_in_ollamas_shape(tmp_path: Path) -> None:
    async with real_router(tmp_path, MODELS) as rt:
        client = client_of(rt.url)
        with pytest.raises(ollama.ResponseError) as missing:
            await client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
        assert missing.value.status_code == 404 and "'nope'" in missing.value.error
        with pytest.raises(ollama.ResponseError) as bad_option:
            await client.chat(model="m", messages=[{"role": "user", "content": "x"}], options={"warmth": 1})
        assert bad_option.value.status_code == 400 and "'warmth'" in bad_option.value.error
        # The model has no projector: llama-server's own refusal of the image comes back as Ollama's error.
        with pytest.raises(ollama.ResponseError) as image:
            await client.chat(
                model="m", messages=[{"role": "user", "content": "what is it?", "images": [b"\x89PNG\r\n"]}]
            )
        assert 400 <= image.value.status_code < 600 and image.value.error
        # A suffix asks llama-server's /infill; this model's vocabulary has no fill-in-the-middle tokens.
        with pytest.raises(ollama.ResponseError) as infill:
            await client.generate(model="m", prompt="def f(", suffix="    return x")
        assert infill.value.status_code == 501 and "Infill is not supported" in infill.value.error
        answer = await rt.client.post("/api/pull", json={"model": "llama3"})
        assert answer.status_code == 501 and "config" in answer.json()["error"]
        curl = await rt.client.post(
            "/api/generate", json={"model": "m", "prompt": "a", "options": {"num_predict": 2}}
        )
        lines = [json.loads(line) for line in curl.text.splitlines()]  # Ollama streams unless told not to
        assert curl.headers["content-type"] == "application/x-ndjson" and lines[-1]["done"] is True


async def test_langchain_ollama(tmp_path: Path) -> None:
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    async with real_router(tmp_path, MODELS) as rt:
        chat = ChatOllama(model="m", base_url=rt.url, num_predict=4, temperature=0.0)
        message = await trio.to_thread.run_sync(chat.invoke, "Hello")
        assert isinstance(message.content, str) and message.content
        assert message.usage_metadata is not None and message.usage_metadata["output_tokens"] == 4
        pieces = await trio.to_thread.run_sync(lambda: [c.content for c in chat.stream("Hello")])
        assert "".join(str(p) for p in pieces)
        embeddings = OllamaEmbeddings(model="e", base_url=rt.url)
        vector = await trio.to_thread.run_sync(embeddings.embed_query, "one")
        assert len(vector) == 64
