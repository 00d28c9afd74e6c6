"""Tokens and templates. One token per whitespace-separated word (``str.split()``); a token's id is the
CRC-32 of the word's UTF-8 bytes. Chat messages are rendered ChatML-like, with markers that are tokens of
their own. Embeddings and rerank scores are derived deterministically from the text.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from typing import Any

CHAT_TEMPLATE = "chatml"
_VOCAB: dict[int, str] = {}


def token_id(word: str) -> int:
    tid = zlib.crc32(word.encode("utf-8"))
    _VOCAB.setdefault(tid, word)
    return tid


def tokenize(text: str) -> list[int]:
    return [token_id(w) for w in text.split()]


def detokenize(ids: Iterable[int]) -> str:
    return " ".join(_VOCAB.get(i, f"<unk:{i}>") for i in ids)


def text_of(content: Any) -> str:
    """The plain text of message content in any of the OpenAI / Anthropic / Responses shapes."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (text_of(part) for part in content) if t)
    if isinstance(content, dict):
        for key in ("text", "content", "input", "arguments", "output"):
            if key in content:
                value = content[key]
                return value if isinstance(value, str) else text_of(value)
        if content.get("type") in ("image", "image_url", "input_image", "input_audio"):
            return "<media>"
        return json.dumps(content, sort_keys=True)
    return str(content)


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """A ChatML-like rendering; markers stand apart from the text so that they are tokens of their own."""
    parts = []
    for message in messages:
        role = str(message.get("role", "user"))
        body = text_of(message.get("content"))
        for call in message.get("tool_calls") or []:
            body += "\n" + text_of(call.get("function", call))
        parts.append(f"<|im_start|>{role}\n{body}\n<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def embedding_for(text: str, dim: int) -> list[float]:
    """A deterministic unit vector derived from the text."""
    state = zlib.crc32(text.encode("utf-8")) or 1
    values = []
    for _ in range(dim):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        values.append(state / 0x3FFFFFFF - 1.0)
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


def rerank_score(query: str, document: str) -> float:
    q = set(query.lower().split())
    d = set(document.lower().split())
    overlap = len(q & d) / len(q | d) if q | d else 0.0
    jitter = (zlib.crc32(f"{query}\0{document}".encode()) % 1000) / 1e5
    return round(overlap + jitter, 6)
