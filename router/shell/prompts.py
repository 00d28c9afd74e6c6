"""What a request's prompt is, for asking a replica to tokenise it: chat-style messages or a plain text.

Used to count a prompt's tokens exactly (pools) and to find the saved KV state that shares the longest
prefix with it (``router.shell.kv_slots``). Both ask a ready replica: ``/apply-template`` renders messages
with the model's own chat template, ``/tokenize`` turns the text into the model's tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import httpx

__all__ = ["PromptProbe", "call_json", "message_text", "messages_of", "prompt_probe", "prompt_tokens"]


def message_text(content: Any) -> str:
    """The text of a message's ``content``: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            message_text(part.get("text", "")) if isinstance(part, dict) else message_text(part)
            for part in content
        )
    if isinstance(content, dict):
        return message_text(content.get("text") or content.get("content") or "")
    return ""


def messages_of(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Chat-style messages (OpenAI chat, Anthropic messages with their system prompt, Responses input)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = [m for m in messages if isinstance(m, dict)]
        system = body.get("system")
        if system:
            out = [{"role": "system", "content": message_text(system)}, *out]
        return out
    items = body.get("input")
    if isinstance(items, list):
        return [m for m in items if isinstance(m, dict)]
    return None


@attrs.frozen
class PromptProbe:
    """A prompt as a replica can tokenise it: ``messages`` (role and text) to render first, or ``text``."""

    messages: tuple[tuple[str, str], ...] | None = None
    text: str | None = None


def prompt_probe(body: Mapping[str, Any]) -> PromptProbe | None:
    """The prompt of a parsed request body, or None when it has no prompt a replica could tokenise."""
    messages = messages_of(body)
    if messages is not None:
        return PromptProbe(
            messages=tuple((str(m.get("role", "user")), message_text(m.get("content"))) for m in messages)
        )
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        prompt = body.get("input")
    return PromptProbe(text=prompt) if isinstance(prompt, str) else None


async def call_json(
    http: httpx.AsyncClient | httpx.AsyncBaseTransport,
    method: str,
    url: str,
    doc: Any | None = None,
    timeout: float | None = None,
) -> Any:
    """One JSON exchange with a replica (through a client, or the bare transport the supervisor holds): the
    reply's document; a status other than 200 raises ``httpx.HTTPStatusError`` quoting the reply."""
    headers = {"content-type": "application/json"} if doc is not None else {}
    content = b"" if doc is None else json.dumps(doc).encode()
    extensions = {} if timeout is None else {"timeout": httpx.Timeout(timeout).as_dict()}
    request = httpx.Request(method, url, content=content, headers=headers, extensions=extensions)
    if isinstance(http, httpx.AsyncClient):
        response = await http.send(request)
        data = response.content
    else:
        response = await http.handle_async_request(request)
        try:
            data = await response.aread()
        finally:
            await response.aclose()
    if response.status_code != 200:
        text = data.decode(errors="replace")[:300]
        raise httpx.HTTPStatusError(
            f"{method} {url}: {response.status_code} {text}", request=request, response=response
        )
    return json.loads(data)


async def prompt_tokens(
    http: httpx.AsyncClient | httpx.AsyncBaseTransport,
    port: int,
    probe: PromptProbe,
    *,
    timeout: float = 5.0,
    add_special: bool = False,
) -> list[int] | None:
    """The tokens of ``probe`` as the replica on ``port`` sees them, or None when it cannot say."""
    base = f"http://127.0.0.1:{port}"
    try:
        if probe.messages is not None:
            plain = [{"role": role, "content": text} for role, text in probe.messages]
            rendered = await call_json(http, "POST", f"{base}/apply-template", {"messages": plain}, timeout)
            prompt = rendered.get("prompt", "")
        else:
            prompt = probe.text or ""
        doc: dict[str, Any] = {"content": prompt}
        if add_special:
            doc.update(add_special=True, parse_special=True)
        reply = await call_json(http, "POST", f"{base}/tokenize", doc, timeout)
        tokens = reply.get("tokens")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens
