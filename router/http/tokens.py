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

from router.shell.prompts import message_text, messages_of, prompt_probe, prompt_tokens

TEMPLATE_TOKENS_PER_MESSAGE = 8
_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")


def requested_output(body: dict[str, Any]) -> int:
    """Output tokens the request asks for (0 when it does not say)."""
    for key in _OUTPUT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def prompt_upper_bound(body: dict[str, Any]) -> int:
    """Tokens the prompt can have at most (UTF-8 bytes, plus template tokens per message)."""
    messages = messages_of(body)
    if messages is not None:
        total = 0
        for message in messages:
            total += len(message_text(message.get("content")).encode()) + TEMPLATE_TOKENS_PER_MESSAGE
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
    probe = prompt_probe(body)
    if probe is None:
        return None
    tokens = await prompt_tokens(client, port, probe)
    return None if tokens is None else len(tokens)
