"""How many tokens a request needs in one slot: prompt plus requested output.

Pools use this to skip members whose per-slot context is too small. The fast path is a bound: for the
byte-level and SentencePiece vocabularies llama.cpp models use, a prompt never has more tokens than its UTF-8
bytes (plus a few template tokens per message). When that bound fits every member it is good enough; when it
does not, the exact count comes from a ready replica (``/apply-template`` then ``/tokenize``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

TEMPLATE_TOKENS_PER_MESSAGE = 8
_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")


def requested_output(body: dict[str, Any]) -> int:
    """Output tokens the request asks for (0 when it does not say)."""
    for key in _OUTPUT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text(part.get("text", "")) if isinstance(part, dict) else _text(part) for part in content
        )
    if isinstance(content, dict):
        return _text(content.get("text") or content.get("content") or "")
    return ""


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Chat-style messages (OpenAI chat, Anthropic messages with their system prompt, Responses input)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = [m for m in messages if isinstance(m, dict)]
        system = body.get("system")
        if system:
            out = [{"role": "system", "content": _text(system)}, *out]
        return out
    items = body.get("input")
    if isinstance(items, list):
        return [m for m in items if isinstance(m, dict)]
    return None


def prompt_upper_bound(body: dict[str, Any]) -> int:
    """Tokens the prompt can have at most (UTF-8 bytes, plus template tokens per message)."""
    messages = messages_of(body)
    if messages is not None:
        total = 0
        for message in messages:
            total += len(_text(message.get("content")).encode()) + TEMPLATE_TOKENS_PER_MESSAGE
        return total + TEMPLATE_TOKENS_PER_MESSAGE
    for key in ("prompt", "input", "content"):
        value = body.get(key)
        if isinstance(value, str):
            return len(value.encode()) + TEMPLATE_TOKENS_PER_MESSAGE
        if isinstance(value, list):
            return len(json.dumps(value).encode())
    return 0


async def exact_prompt_tokens(client: httpx.AsyncClient, port: int, body: dict[str, Any]) -> int | None:
    """The prompt's token count from a ready replica, or None when it cannot be had cheaply."""
    base = f"http://127.0.0.1:{port}"
    try:
        messages = messages_of(body)
        if messages is not None:
            plain = [{"role": m.get("role", "user"), "content": _text(m.get("content"))} for m in messages]
            reply = await client.post(f"{base}/apply-template", json={"messages": plain}, timeout=5.0)
            reply.raise_for_status()
            prompt = reply.json().get("prompt", "")
        else:
            prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else body.get("input", "")
            if not isinstance(prompt, str):
                return None
        reply = await client.post(f"{base}/tokenize", json={"content": prompt}, timeout=5.0)
        reply.raise_for_status()
        tokens = reply.json().get("tokens")
        return len(tokens) if isinstance(tokens, list) else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
