"""Read token counts and the first token's arrival out of a reply as its bytes pass through.

The proxy hands every relayed chunk to a :class:`UsageSniffer`. Nothing is held back or copied into the
reply: the sniffer only looks. For server-sent events it splits lines as they come, parses the small JSON
events until the first one that carries generated content, and afterwards only the events that mention
``usage``, ``timings`` or ``error`` (usually the last one or two). For a plain JSON body it keeps the first
64 KiB and a sliding 16 KiB tail: a body that fits is parsed whole, a larger one (embeddings, long
completions) is searched in its tail, where llama-server puts ``usage`` and ``timings``.

Token fields understood (llama-server, OpenAI, Anthropic and Responses shapes):

- prompt: ``usage.prompt_tokens`` / ``usage.input_tokens`` / ``tokens_evaluated`` /
  ``timings.prompt_n + timings.cache_n``
- generated: ``usage.completion_tokens`` / ``usage.output_tokens`` / ``tokens_predicted`` /
  ``timings.predicted_n``
- cached: ``timings.cache_n`` / ``usage.prompt_tokens_details.cached_tokens`` /
  ``usage.input_tokens_details.cached_tokens`` / ``usage.cache_read_input_tokens``
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

log = logging.getLogger("router")

HEAD_LIMIT = 64 * 1024
TAIL_LIMIT = 16 * 1024
LINE_LIMIT = 256 * 1024
ERROR_TEXT_LIMIT = 500

_MARKERS = re.compile(rb'"(?:usage|timings|error)"')  # what makes an event worth parsing once content began
_CONTENT_TYPES = frozenset(
    {
        "content_block_delta",
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
    }
)


@attrs.frozen
class Usage:
    """What a reply said about its tokens; None where it did not say."""

    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    cached_tokens: int | None = None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def usage_of(obj: Mapping[str, Any]) -> Usage:
    """The token counts one JSON object (a whole body or one event) carries, looking into the places the
    known reply shapes keep them (top level, ``response`` of Responses events, ``message`` of Anthropic's
    message_start)."""
    prompt = generated = cached = None
    for holder in (obj, _dig(obj, "response"), _dig(obj, "message")):
        if not isinstance(holder, Mapping):
            continue
        usage = holder.get("usage")
        timings = holder.get("timings")
        if isinstance(usage, Mapping):
            prompt = _first(prompt, _int(usage.get("prompt_tokens")), _int(usage.get("input_tokens")))
            generated = _first(
                generated, _int(usage.get("completion_tokens")), _int(usage.get("output_tokens"))
            )
            cached = _first(
                cached,
                _int(_dig(usage, "prompt_tokens_details", "cached_tokens")),
                _int(_dig(usage, "input_tokens_details", "cached_tokens")),
                _int(usage.get("cache_read_input_tokens")),
            )
        prompt = _first(prompt, _int(holder.get("tokens_evaluated")))
        generated = _first(generated, _int(holder.get("tokens_predicted")))
        if isinstance(timings, Mapping):
            cache_n = _int(timings.get("cache_n"))
            prompt_n = _int(timings.get("prompt_n"))
            if prompt is None and prompt_n is not None:
                prompt = prompt_n + (cache_n or 0)
            generated = _first(generated, _int(timings.get("predicted_n")))
            cached = _first(cache_n, cached)
    return Usage(prompt, generated, cached)


def _first(*values: int | None) -> int | None:
    for value in values:
        if value is not None:
            return value
    return None


def _merge(old: Usage, new: Usage) -> Usage:
    """Later events win field by field (Anthropic streams give input and output tokens in two events)."""
    return Usage(
        new.prompt_tokens if new.prompt_tokens is not None else old.prompt_tokens,
        new.generated_tokens if new.generated_tokens is not None else old.generated_tokens,
        new.cached_tokens if new.cached_tokens is not None else old.cached_tokens,
    )


def has_content(event: Mapping[str, Any]) -> bool:
    """Whether one streamed event carries generated output (text, reasoning or a tool call)."""
    kind = event.get("type")
    if isinstance(kind, str) and kind in _CONTENT_TYPES:
        return True
    choices = event.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping) and any(
                delta.get(k) for k in ("content", "reasoning_content", "tool_calls", "function_call")
            ):
                return True
            if choice.get("text"):
                return True
        return False
    content = event.get("content")  # llama-server's own /completion and /infill
    return isinstance(content, str) and bool(content) and "choices" not in event


def error_text(obj: Mapping[str, Any]) -> tuple[int | None, str] | None:
    """(status code if stated, message) of an error object in OpenAI, Anthropic or llama-server shape."""
    error = obj.get("error")
    if error is None:
        return None
    if isinstance(error, Mapping):
        message = error.get("message")
        code = _int(error.get("code"))
        text = message if isinstance(message, str) else json.dumps(error)[:ERROR_TEXT_LIMIT]
        return (code if code is not None and 100 <= code < 600 else None), text[:ERROR_TEXT_LIMIT]
    return None, str(error)[:ERROR_TEXT_LIMIT]


_TAIL_FIELDS = {
    "prompt_tokens": re.compile(rb'(?<!\\)"(?:prompt_tokens|input_tokens)"\s*:\s*(\d+)'),
    "generated_tokens": re.compile(rb'(?<!\\)"(?:completion_tokens|output_tokens|predicted_n)"\s*:\s*(\d+)'),
    "cached_tokens": re.compile(rb'(?<!\\)"(?:cache_n|cached_tokens)"\s*:\s*(\d+)'),
}


def _usage_in_text(text: bytes) -> Usage:
    found: dict[str, int] = {}
    for field, pattern in _TAIL_FIELDS.items():
        matches = pattern.findall(text)
        if matches:
            found[field] = int(matches[-1])
    return Usage(**found)


class UsageSniffer:
    """Watches one reply. ``feed`` every chunk in order, then ``close``; read the results after.

    ``first_content_at`` is the ``clock()`` reading when the first chunk with generated content arrived (only
    for event streams; a plain JSON reply has no first token to speak of). ``error`` holds the status and
    message of an error object found in the reply (an in-band stream error or an error body).
    """

    def __init__(self, *, sse: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.sse = sse
        self.clock = clock
        self.usage = Usage()
        self.first_content_at: float | None = None
        self.error: tuple[int | None, str] | None = None
        self.bytes_seen = 0
        self._line = bytearray()
        self._skipping = False
        self._head = bytearray()
        self._tail = bytearray()
        self._closed = False

    def feed(self, chunk: bytes) -> None:
        if not chunk or self._closed:
            return
        self.bytes_seen += len(chunk)
        try:
            if self.sse:
                self._feed_sse(chunk)
            else:
                self._feed_json(chunk)
        except Exception:  # looking must never disturb the relay
            log.exception("usage sniffer gave up on a reply")
            self._closed = True

    def close(self) -> None:
        """The reply is over: look at what is left (a last line without newline, or the JSON body)."""
        if self._closed:
            return
        self._closed = True
        if self.sse:
            if self._line and not self._skipping:
                self._take_line(bytes(self._line))
            self._line.clear()
            return
        if self.bytes_seen <= HEAD_LIMIT:
            self._take_json(bytes(self._head))
        else:
            self.usage = _merge(self.usage, _usage_in_text(bytes(self._tail)))
        self._head.clear()
        self._tail.clear()

    # ------------------------------------------------------------------------------------- event stream
    def _feed_sse(self, chunk: bytes) -> None:
        if (
            self.first_content_at is not None
            and not self._line
            and not self._skipping
            and chunk.endswith(b"\n")
            and _MARKERS.search(chunk) is None
        ):
            return  # whole lines only, none of them usage, timings or an error: nothing to look at
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                rest = chunk[start:]
                if not self._skipping:
                    self._line += rest
                    if len(self._line) > LINE_LIMIT:  # an oversized event: skip it rather than hoard it
                        self._line.clear()
                        self._skipping = True
                return
            if self._skipping:
                self._skipping = False
            else:
                self._line += chunk[start:end]
                self._take_line(bytes(self._line))
            self._line.clear()
            start = end + 1

    def _take_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data.startswith(b"{"):
            return
        if self.first_content_at is not None and _MARKERS.search(data) is None:
            return
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            return
        if not isinstance(event, dict):
            return
        if self.first_content_at is None and has_content(event):
            self.first_content_at = self.clock()
        self.usage = _merge(self.usage, usage_of(event))
        found = error_text(event)
        if found is not None and self.error is None:
            self.error = found

    # -------------------------------------------------------------------------------------- JSON body
    def _feed_json(self, chunk: bytes) -> None:
        if len(self._head) < HEAD_LIMIT:
            self._head += chunk[: HEAD_LIMIT - len(self._head)]
        self._tail += chunk
        if len(self._tail) > TAIL_LIMIT:
            del self._tail[: len(self._tail) - TAIL_LIMIT]

    def _take_json(self, body: bytes) -> None:
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            return
        if isinstance(obj, dict):
            self.usage = _merge(self.usage, usage_of(obj))
            self.error = error_text(obj)
        elif isinstance(obj, list):  # /tokenize-like lists and batch replies carry no usage
            return
