"""Ollama's request bodies as llama-server requests, and llama-server's answers as Ollama's."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from router.http.ollama.replies import StreamTranslator, Timing, whole_reply
from router.http.ollama.requests import Exchange, Kind, translate
from router.http.request_body import BodyError

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
JPEG = "/9j/4AAQSkZJRgABAQAAAQABAAD"


def test_chat_options_format_and_think_become_llama_server_fields() -> None:
    ex = translate(
        "/api/chat",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0.1, "num_predict": 7, "top_k": 5, "num_keep": 4, "num_ctx": 8192},
            "format": "json",
            "think": True,
            "keep_alive": "5m",
        },
    )
    assert ex.kind is Kind.CHAT and ex.path == "/v1/chat/completions" and ex.stream and ex.chat
    body = ex.body
    assert (
        body["temperature"] == 0.1 and body["max_tokens"] == 7 and body["top_k"] == 5 and body["n_keep"] == 4
    )
    assert "num_ctx" not in body and "keep_alive" not in body and "options" not in body
    assert body["response_format"] == {"type": "json_object"}
    assert (
        body["chat_template_kwargs"] == {"enable_thinking": True} and body["reasoning_format"] == "deepseek"
    )
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("value", [-1, -2])
def test_num_predict_without_limit_sets_none(value: int) -> None:
    ex = translate(
        "/api/chat", {"model": "m", "messages": [{"role": "user"}], "options": {"num_predict": value}}
    )
    assert "max_tokens" not in ex.body


def test_a_schema_becomes_a_json_schema_response_format_and_stream_false_is_kept() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    ex = translate(
        "/api/chat", {"model": "m", "messages": [{"role": "user"}], "format": schema, "stream": False}
    )
    assert ex.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }
    assert ex.stream is False and ex.body["stream"] is False and "stream_options" not in ex.body


def test_images_tool_calls_and_tool_replies() -> None:
    ex = translate(
        "/api/chat",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "what is it?", "images": [PNG, JPEG]},
                {
                    "role": "assistant",
                    "content": "",
                    "thinking": "look it up",
                    "tool_calls": [
                        {"function": {"name": "lookup", "arguments": {"q": "x"}}},
                        {"function": {"name": "lookup", "arguments": {"q": "y"}}},
                    ],
                },
                {"role": "tool", "content": "X", "tool_name": "lookup"},
                {"role": "tool", "content": "Y", "tool_name": "lookup"},
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
        },
    )
    user, assistant, first, second = ex.body["messages"]
    assert user["content"] == [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + JPEG}},
    ]
    calls = assistant["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"q": "x"}, {"q": "y"}]
    assert assistant["reasoning_content"] == "look it up"
    assert first["tool_call_id"] == calls[0]["id"] and second["tool_call_id"] == calls[1]["id"]
    assert calls[0]["id"] != calls[1]["id"] and first["name"] == "lookup"
    assert ex.body["tools"][0]["function"]["name"] == "lookup"


def test_generate_forms() -> None:
    chat = translate("/api/generate", {"model": "m", "prompt": "p", "system": "s", "images": [PNG]})
    assert chat.kind is Kind.CHAT and not chat.chat
    assert chat.body["messages"][0] == {"role": "system", "content": "s"}
    assert chat.body["messages"][1]["content"][1]["image_url"]["url"].startswith("data:image/png")
    raw = translate("/api/generate", {"model": "m", "prompt": "p", "raw": True, "stream": False})
    assert raw.kind is Kind.TEXT and raw.path == "/v1/completions" and raw.body["prompt"] == "p"
    infill = translate("/api/generate", {"model": "m", "prompt": "def f(", "suffix": "\n    return x"})
    assert infill.kind is Kind.INFILL and infill.path == "/infill"
    assert infill.body["input_prefix"] == "def f(" and infill.body["input_suffix"] == "\n    return x"


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [
        ("/api/generate", {"model": "m"}, Kind.LOAD),
        ("/api/generate", {"model": "m", "prompt": ""}, Kind.LOAD),
        ("/api/generate", {"model": "m", "keep_alive": 0}, Kind.UNLOAD),
        ("/api/chat", {"model": "m", "messages": []}, Kind.LOAD),
        ("/api/chat", {"model": "m", "keep_alive": "0s"}, Kind.UNLOAD),
        ("/api/generate", {"model": "m", "keep_alive": -1}, Kind.LOAD),
    ],
)
def test_the_load_and_unload_idioms(path: str, body: dict[str, Any], kind: Kind) -> None:
    ex = translate(path, body)
    assert ex.kind is kind and ex.path == "/tokenize" and ex.body == {"model": "m", "content": ""}


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/api/chat", {"messages": [{"role": "user"}]}, "names no model"),
        ("/api/chat", {"model": "m", "messages": [{"role": "user"}], "options": {"warmth": 1}}, "'warmth'"),
        ("/api/chat", {"model": "m", "messages": [{"content": "x"}]}, "messages[0] has no 'role'"),
        ("/api/chat", {"model": "m", "messages": [{"role": "user"}], "format": "yaml"}, "'format'"),
        ("/api/chat", {"model": "m", "messages": [{"role": "user"}], "think": "max"}, "'think'"),
        ("/api/chat", {"model": "m", "messages": "hi"}, "'messages' must be an array"),
        ("/api/generate", {"model": "m", "prompt": "p", "template": "{{ .Prompt }}"}, "'template'"),
        ("/api/generate", {"model": "m", "prompt": "p", "context": [1, 2]}, "/api/chat"),
        ("/api/generate", {"model": "m", "prompt": "p", "raw": True, "images": [PNG]}, "without raw"),
        ("/api/embed", {"model": "e", "input": []}, "non-empty array"),
        ("/api/embed", {"model": "e", "input": "x", "dimensions": 0}, "'dimensions'"),
        ("/api/embeddings", {"model": "e", "prompt": ["x"]}, "'prompt' must be a string"),
    ],
)
def test_bodies_that_cannot_be_served_are_refused_saying_why(
    path: str, body: dict[str, Any], words: str
) -> None:
    with pytest.raises(BodyError) as refused:
        translate(path, body)
    assert words in str(refused.value)


def _sse(*events: Any) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events
    )


def _delta(**delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def test_a_chat_stream_in_any_chunking_becomes_the_same_lines() -> None:
    stream = b": waiting for 'm' 1 s\n\n" + _sse(
        _delta(role="assistant", content=None),
        _delta(content="Hel"),
        _delta(reasoning_content="hmm"),
        _delta(content="lo"),
        _delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "now", "arguments": '{"tz"'}}]),
        _delta(tool_calls=[{"index": 0, "function": {"arguments": ': "UTC"}'}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
            "timings": {"predicted_ms": 20.0},
        },
        b"[DONE]",
    )

    ex = Exchange(Kind.CHAT, "/v1/chat/completions", {}, True, "m", chat=True)
    for size in (1, 7, len(stream)):
        translator = StreamTranslator(ex, Timing(0.0))
        out = b"".join(translator.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        out += translator.close()
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["message"].get("content") for line in lines] == ["Hel", "", "lo", "", ""]
        assert lines[1]["message"]["thinking"] == "hmm"
        assert all(line["message"]["role"] == "assistant" and line["model"] == "m" for line in lines)
        assert lines[3]["message"]["tool_calls"] == [
            {"id": "c1", "function": {"index": 0, "name": "now", "arguments": {"tz": "UTC"}}}
        ]
        last = lines[-1]
        assert last["done"] is True and last["done_reason"] == "stop"
        assert (
            last["prompt_eval_count"] == 9 and last["eval_count"] == 4 and last["eval_duration"] == 20_000_000
        )
        assert [line["done"] for line in lines] == [False] * 4 + [True]


def test_a_stream_that_fails_or_breaks_off_ends_with_an_error_line() -> None:

    ex = Exchange(Kind.TEXT, "/v1/completions", {}, True, "m", chat=False)
    failed = StreamTranslator(ex, Timing(0.0))
    out = failed.feed(_sse({"choices": [{"text": "a"}]}, {"error": {"message": "the replica of 'm' exited"}}))
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [lines[0], {"error": "the replica of 'm' exited"}] and lines[0]["response"] == "a"
    assert failed.finished and failed.close() == b""
    broken = StreamTranslator(ex, Timing(0.0))
    broken.feed(_sse({"choices": [{"text": "a"}]}))
    assert "ended before it was complete" in json.loads(broken.close())["error"]


def test_whole_answers() -> None:

    chat = Exchange(Kind.CHAT, "/v1/chat/completions", {}, False, "m", chat=True)
    doc = {
        "choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "timings": {"prompt_ms": 1.5, "predicted_ms": 4.0},
    }
    reply = whole_reply(chat, doc, Timing(0.0))
    assert reply["message"] == {"role": "assistant", "content": "hi"} and reply["done_reason"] == "length"
    assert reply["prompt_eval_duration"] == 1_500_000 and reply["eval_count"] == 2
    embed = Exchange(Kind.EMBED, "/v1/embeddings", {}, False, "e", chat=False, dimensions=2)
    vectors = {
        "data": [{"index": 1, "embedding": [0.0, 3.0, 9.0]}, {"index": 0, "embedding": [3.0, 4.0, 1.0]}]
    }
    shortened = whole_reply(embed, vectors, Timing(0.0))["embeddings"]
    assert shortened == [[0.6, 0.8], [0.0, 1.0]]
    assert all(math.isclose(math.hypot(*v), 1.0) for v in shortened)
    infill = Exchange(Kind.INFILL, "/infill", {}, False, "m", chat=False)
    answer = whole_reply(
        infill, {"content": "x = 1", "stop_type": "limit", "tokens_predicted": 4}, Timing(0.0)
    )
    assert answer["response"] == "x = 1" and answer["done_reason"] == "length" and answer["eval_count"] == 4
