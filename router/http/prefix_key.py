"""A request's prefix chain: block hashes of its leading content, for the scheduler's prefix affinity.

llama-server skips the prefill of whatever its slot (or its host-memory prompt cache) still holds from an
earlier prompt. Agents resend the same system prompt, tools and conversation so far with every turn, so the
scheduler prefers the replica that served the longest part of that content. It compares chains:

- the leading content is serialised canonically, in the order the prompt template lays it out: tools, then
  the system prompt (Anthropic ``system``, Responses ``instructions``), then every message in order, each
  as compact JSON with sorted keys followed by a separator byte that JSON never emits unescaped. A later
  turn of the same conversation appends messages, so its serialisation starts with the earlier one's.
  Per-request fields (model, stream, max_tokens, temperature, ...) are left out;
- the bytes are cut into blocks of ``BLOCK`` bytes; only full blocks count, at most ``MAX_BLOCKS``;
- element i of the chain is ``blake2b(element i-1 + block i)`` (8 bytes, as an int), so it stands for the
  first i+1 blocks and two requests share their first k elements exactly when they share their first k
  blocks.

``BLOCK`` = 1 KiB is a few hundred tokens: fine enough that a short system prompt or one turn moves the
match, coarse enough that a long prompt stays a short chain. ``MAX_BLOCKS`` = 256 caps the chain at 256 KiB
of leading content (beyond most contexts); past it requests count as sharing everything, and hashing stays
well under a millisecond. Shapes this module does not know give an empty chain: the least busy replica.
A request that only single-replica models may serve is not hashed at all (``request_chain``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from statemachine import Settings, serving_models

BLOCK = 1024
MAX_BLOCKS = 256
_SEPARATOR = b"\x1e"  # ASCII record separator: json.dumps escapes it inside strings

_CHAT = frozenset({"/v1/chat/completions", "/chat/completions", "/v1/messages"})
_RESPONSES = frozenset({"/v1/responses", "/responses"})
_COMPLETIONS = frozenset({"/v1/completions", "/completions", "/completion"})


def _part(tag: str, value: Any) -> bytes:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return tag.encode() + text.encode() + _SEPARATOR


def leading_content(body: dict[str, Any], path: str) -> bytes | None:
    """The canonical serialisation of what the request's prompt starts with, or None for unknown shapes."""
    parts: list[bytes] = []
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        parts.append(_part("t", tools))
    if path in _CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        system = body.get("system")
        if system:
            parts.append(_part("s", system))
        parts += [_part("m", message) for message in messages]
    elif path in _RESPONSES:
        instructions = body.get("instructions")
        if instructions:
            parts.append(_part("s", instructions))
        items = body.get("input")
        if isinstance(items, str):
            parts.append(_part("m", items))
        elif isinstance(items, list):
            parts += [_part("m", item) for item in items]
        else:
            return None
    elif path in _COMPLETIONS:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        # The prompt itself, not its JSON: a longer prompt that starts with it shares its blocks.
        parts.append(b"p" + prompt.encode())
    else:
        return None
    return b"".join(parts)


def chain_of(data: bytes) -> tuple[int, ...]:
    """The hash chain of ``data``'s full blocks (at most ``MAX_BLOCKS``)."""
    chain: list[int] = []
    previous = b""
    for start in range(0, min(len(data) // BLOCK, MAX_BLOCKS) * BLOCK, BLOCK):
        digest = hashlib.blake2b(previous + data[start : start + BLOCK], digest_size=8).digest()
        chain.append(int.from_bytes(digest, "big"))
        previous = digest
    return tuple(chain)


def prefix_chain(body: dict[str, Any], path: str) -> tuple[int, ...]:
    """The prefix chain of a parsed request ``body`` sent to ``path`` (empty when its shape is unknown)."""
    data = leading_content(body, path)
    return () if data is None else chain_of(data)


def request_chain(
    settings: Settings, enabled: bool, target: str, body: dict[str, Any], path: str
) -> tuple[int, ...]:
    """The chain the scheduler is given for a request for ``target``: empty when prefix affinity is off, or
    when no model that may serve ``target`` has more than one replica (there is no choice for it to steer,
    so the hashing is skipped)."""
    if not enabled:
        return ()
    models = settings.models
    if not any(name in models and models[name].replicas > 1 for name in serving_models(settings, target)):
        return ()
    return prefix_chain(body, path)
