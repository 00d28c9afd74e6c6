"""The official OpenAI and Anthropic Python SDKs work unmodified against the router's base URL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support.harness import RouterHandle, running_router

REPLY = "the quick brown fox jumps"


@pytest.fixture
async def handle(tmp_path: Path) -> AsyncIterator[RouterHandle]:
    models = {"chat": {"aliases": ["gpt-local"], "sim": {"tokens": 5, "reply": REPLY}}}
    async with running_router(tmp_path, models) as h:
        yield h


def openai_client(h: RouterHandle) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=h.url + "/v1", api_key="unused", max_retries=0, timeout=30.0)


def anthropic_client(h: RouterHandle) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=h.url, api_key="unused", max_retries=0, timeout=30.0)


async def test_openai_chat_completion(handle: RouterHandle) -> None:
    async with openai_client(handle) as client:
        completion = await client.chat.completions.create(
            model="gpt-local", messages=[{"role": "user", "content": "say something"}]
        )
        models = await client.models.list()
    assert completion.choices[0].message.content is not None
    assert completion.choices[0].message.content.strip() == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert {m.id for m in models.data} == {"chat", "gpt-local"}


async def test_openai_chat_completion_stream(handle: RouterHandle) -> None:
    async with openai_client(handle) as client:
        chunks = await client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "say something"}],
            stream=True,
            max_tokens=3,
        )
        pieces = []
        finish = None
        async for chunk in chunks:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    assert "".join(pieces).strip() == "the quick brown"
    assert finish == "length"


async def test_openai_models_retrieve(handle: RouterHandle) -> None:
    async with openai_client(handle) as client:
        by_name = await client.models.retrieve("chat")
        by_alias = await client.models.retrieve("gpt-local")
        with pytest.raises(openai.NotFoundError) as caught:
            await client.models.retrieve("missing")
    assert by_name.id == "chat" and by_name.object == "model"
    # The alias answers with its own entry, which names the model it stands for.
    assert by_alias.id == "gpt-local" and (by_alias.model_extra or {})["alias_of"] == "chat"
    assert caught.value.status_code == 404


async def test_openai_error_reaches_the_sdk_as_its_exception(handle: RouterHandle) -> None:
    async with openai_client(handle) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 404
    assert "'missing'" in str(caught.value.message)


async def test_anthropic_message(handle: RouterHandle) -> None:
    async with anthropic_client(handle) as client:
        message = await client.messages.create(
            model="chat", max_tokens=64, messages=[{"role": "user", "content": "say something"}]
        )
    assert message.role == "assistant"
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip() == REPLY
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 5


async def test_anthropic_message_stream(handle: RouterHandle) -> None:
    async with (
        anthropic_client(handle) as client,
        client.messages.stream(
            model="gpt-local", max_tokens=2, messages=[{"role": "user", "content": "say something"}]
        ) as stream,
    ):
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces).strip() == "the quick"
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 2
