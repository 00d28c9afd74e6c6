"""Ollama's request bodies as llama-server requests: which endpoint, and the body it gets.

- ``/api/chat``: ``/v1/chat/completions`` (messages with their images, tool calls and thinking; tools;
  ``format``; ``think``; ``options``). No messages at all: the load idiom (or, with ``keep_alive`` 0, the
  unload idiom).
- ``/api/generate``: the prompt as a user message under the model's chat template (``system`` before it),
  ``/v1/completions`` with ``raw``, ``/infill`` with a ``suffix``; no prompt: the load or unload idiom.
- ``/api/embed`` and ``/api/embeddings``: ``/v1/embeddings``.

Ollama streams unless ``stream`` is false. Fields this router cannot honour (``template``, ``context``) are
refused with what to do instead, never dropped.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any

import attrs

from router.http.errors import HttpCode
from router.http.keep_alive import keep_alive_of
from router.http.ollama.options import response_format, sampling_fields, thinking
from router.http.request_body import BodyError

CHAT, GENERATE, EMBED, EMBEDDINGS = "/api/chat", "/api/generate", "/api/embed", "/api/embeddings"
PATHS = (CHAT, GENERATE, EMBED, EMBEDDINGS)


class Kind(enum.Enum):
    """What the replica is asked, which decides how its answer is read back."""

    CHAT = "chat"  # /v1/chat/completions
    TEXT = "text"  # /v1/completions (raw generate)
    INFILL = "infill"  # /infill (generate with a suffix)
    EMBED = "embed"  # /v1/embeddings for /api/embed
    EMBEDDING = "embedding"  # /v1/embeddings for /api/embeddings (one vector)
    LOAD = "load"  # /tokenize of nothing: the model loads, nothing is generated
    UNLOAD = "unload"  # the same with keep_alive 0, when the model is loaded


@attrs.frozen
class Exchange:
    """One Ollama call as llama-server sees it. ``model``: the name as asked (Ollama's answers repeat it);
    ``chat``: answer in /api/chat's shape (a ``message``) rather than /api/generate's (a ``response``);
    ``dimensions``: /api/embed's vector length (None: as the model gives it)."""

    kind: Kind
    path: str
    body: dict[str, Any]
    stream: bool
    model: str
    chat: bool
    dimensions: int | None = None


def _invalid(message: str) -> BodyError:
    return BodyError(message, HttpCode.INVALID_REQUEST)


def translate(path: str, doc: Mapping[str, Any]) -> Exchange:
    """The llama-server request for an Ollama call to ``path``; BodyError for a body that cannot be served."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise BodyError('the request names no model; add "model"', HttpCode.MODEL_REQUIRED)
    if path == CHAT:
        return _chat(doc, model)
    if path == GENERATE:
        return _generate(doc, model)
    return _embed(doc, model, legacy=path == EMBEDDINGS)


def _streams(doc: Mapping[str, Any]) -> bool:
    return doc.get("stream") is not False


def _idiom(doc: Mapping[str, Any], model: str, chat: bool) -> Exchange:
    """The load idiom, or the unload idiom when ``keep_alive`` is 0: nothing is generated."""
    unload = keep_alive_of(doc, None) == 0
    body = {"model": model, "content": ""}
    kind = Kind.UNLOAD if unload else Kind.LOAD
    return Exchange(kind, "/tokenize", body, stream=False, model=model, chat=chat)


def _generation_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    fields.update(sampling_fields(doc.get("options")))
    fields.update(response_format(doc.get("format")))
    if doc.get("logprobs") is True:
        fields["logprobs"] = True
        top = doc.get("top_logprobs")
        if isinstance(top, int) and not isinstance(top, bool) and top > 0:
            fields["top_logprobs"] = top
    return fields


def _stream_fields(stream: bool) -> dict[str, Any]:
    return {"stream": True, "stream_options": {"include_usage": True}} if stream else {"stream": False}


def _chat(doc: Mapping[str, Any], model: str) -> Exchange:
    messages = doc.get("messages")
    if messages is None or messages == []:
        return _idiom(doc, model, chat=True)
    if not isinstance(messages, list):
        raise _invalid('\'messages\' must be an array of {"role": ..., "content": ...} objects')
    stream = _streams(doc)
    body: dict[str, Any] = {"model": model, "messages": chat_messages(messages)}
    tools = doc.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid('\'tools\' must be an array of {"type": "function", "function": {...}} objects')
        if tools:
            body["tools"] = tools
    body.update(_generation_fields(doc))
    body.update(thinking(doc.get("think")))
    body.update(_stream_fields(stream))
    return Exchange(Kind.CHAT, "/v1/chat/completions", body, stream, model, chat=True)


def _generate(doc: Mapping[str, Any], model: str) -> Exchange:
    prompt = doc.get("prompt")
    images = doc.get("images")
    if prompt is not None and not isinstance(prompt, str):
        raise _invalid("'prompt' must be a string")
    for name, instead in (
        ("template", "the model's own chat template is used; send the text to apply it to with raw: true"),
        ("context", "send the conversation to /api/chat as messages (its prompt is cached by the replica)"),
    ):
        if doc.get(name) not in (None, "", []):
            raise _invalid(f"'{name}' is not supported here: {instead}")
    if not prompt and not images:
        return _idiom(doc, model, chat=False)
    stream = _streams(doc)
    fields = _generation_fields(doc)
    suffix = doc.get("suffix")
    if suffix not in (None, ""):
        if not isinstance(suffix, str):
            raise _invalid("'suffix' must be a string")
        if images:
            raise _invalid("'images' cannot go with 'suffix': fill-in-the-middle takes text only")
        body = {"model": model, "input_prefix": prompt or "", "input_suffix": suffix, "prompt": ""}
        body.update(fields)
        body["stream"] = stream
        return Exchange(Kind.INFILL, "/infill", body, stream, model, chat=False)
    if doc.get("raw") is True:
        if images:
            raise _invalid("'images' need the model's chat template: send them without raw: true")
        body = {"model": model, "prompt": prompt}
        body.update(fields)
        body.update(_stream_fields(stream))
        return Exchange(Kind.TEXT, "/v1/completions", body, stream, model, chat=False)
    messages: list[dict[str, Any]] = []
    system = doc.get("system")
    if system not in (None, ""):
        if not isinstance(system, str):
            raise _invalid("'system' must be a string")
        messages.append({"role": "system", "content": system})
    messages.append(_message({"role": "user", "content": prompt or "", "images": images}, 0, {}))
    body = {"model": model, "messages": messages}
    body.update(fields)
    body.update(thinking(doc.get("think")))
    body.update(_stream_fields(stream))
    return Exchange(Kind.CHAT, "/v1/chat/completions", body, stream, model, chat=False)


def _embed(doc: Mapping[str, Any], model: str, *, legacy: bool) -> Exchange:
    field = "prompt" if legacy else "input"
    text = doc.get(field)
    valid = isinstance(text, str) or (
        not legacy and isinstance(text, list) and bool(text) and all(isinstance(t, str) for t in text)
    )
    if not valid:
        shape = "a string" if legacy else "a string or a non-empty array of strings"
        raise _invalid(f"'{field}' must be {shape}")
    dimensions = doc.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise _invalid(f"'dimensions' = {dimensions!r} is not a positive number")
    body = {"model": model, "input": text}
    kind = Kind.EMBEDDING if legacy else Kind.EMBED
    return Exchange(kind, "/v1/embeddings", body, False, model, chat=False, dimensions=dimensions)


# ------------------------------------------------------------------------------------------------ messages

_IMAGE_KINDS = (
    ("iVBOR", "image/png"),
    ("/9j/", "image/jpeg"),
    ("R0lGOD", "image/gif"),
    ("UklGR", "image/webp"),
)


def image_url(data: str) -> str:
    """A base64 image as the data URL llama-server reads (the type guessed from its first bytes)."""
    mime = next((kind for start, kind in _IMAGE_KINDS if data.startswith(start)), "image/jpeg")
    return f"data:{mime};base64,{data}"


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's: images as content parts, tool calls with ids and JSON arguments, the
    reply to a tool call tied to it by that id, ``thinking`` as ``reasoning_content``."""
    pending: dict[str, list[str]] = {}  # tool name -> ids of its calls not yet answered, in order
    return [_message(m, i, pending) for i, m in enumerate(messages)]


def _message(message: Any, index: int, pending: dict[str, list[str]]) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid(f"{where} must be an object with a 'role' and a 'content'")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise _invalid(f"{where} has no 'role' (system, user, assistant or tool)")
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise _invalid(f"{where}.content must be a string")
    out: dict[str, Any] = {"role": role, "content": content}
    images = message.get("images")
    if images:
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise _invalid(f"{where}.images must be an array of base64-encoded images")
        parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
        parts += [{"type": "image_url", "image_url": {"url": image_url(i)}} for i in images]
        out["content"] = parts
    thinking_text = message.get("thinking")
    if isinstance(thinking_text, str) and thinking_text and role == "assistant":
        out["reasoning_content"] = thinking_text
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = _tool_calls(calls, index, where, pending)
    if role == "tool":
        name = message.get("tool_name") or message.get("name")
        if isinstance(name, str) and name:
            out["name"] = name
            waiting = pending.get(name)
            if waiting:
                out["tool_call_id"] = waiting.pop(0)
    return out


def _tool_calls(calls: Any, index: int, where: str, pending: dict[str, list[str]]) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _invalid(f"{where}.tool_calls must be an array")
    out = []
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise _invalid(f"{where}.tool_calls[{n}] has no function name")
        arguments = function.get("arguments") if isinstance(function, dict) else None
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        ident = call.get("id") if isinstance(call.get("id"), str) else f"call_{index}_{n}"
        pending.setdefault(name, []).append(ident)
        out.append({"id": ident, "type": "function", "function": {"name": name, "arguments": text}})
    return out
