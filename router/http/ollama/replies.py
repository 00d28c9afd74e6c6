"""llama-server's answers in Ollama's shapes: whole replies as one JSON object, streams (server-sent events)
as NDJSON lines, errors as ``{"error": "..."}``.

Every line of a chat stream carries ``message.role``; the last one has ``done: true``, the ``done_reason``
and the counts and durations (nanoseconds) Ollama reports: ``prompt_eval_*`` and ``eval_*`` from the
replica's own timings, ``load_duration`` the time the request waited for its replica (a load included),
``total_duration`` the time since the request arrived. Tool calls, whose arguments stream in pieces, are
sent whole, on one line before the last.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from router.http.ollama.requests import Exchange, Kind
from router.journal.usage import error_text

_NS = 1_000_000_000


def created_at() -> str:
    """The time now as Ollama writes it (RFC 3339, UTC)."""
    now = time.time()
    micros = int((now % 1) * 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{micros:06d}Z"


def error_line(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


def error_message(body: bytes) -> str:
    """The message of an error reply in any shape the router or a replica answers with."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return body.decode("utf-8", "replace").strip() or "the request failed"
    found = error_text(doc) if isinstance(doc, dict) else None
    return found[1] if found is not None else json.dumps(doc)


@attrs.define
class Timing:
    """When the request arrived (monotonic seconds) and how long it waited for its replica (read at the end,
    since a stream starts before its request is sent)."""

    arrived: float
    waited: Callable[[], float] = lambda: 0.0


def _ns(seconds: float) -> int:
    return max(0, int(seconds * _NS)) if math.isfinite(seconds) else 0


def _count(*values: Any) -> int:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def done_fields(
    reason: str | None, usage: Mapping[str, Any], timings: Mapping[str, Any], timing: Timing
) -> dict[str, Any]:
    """The fields of a finished answer: why it ended, its token counts and its durations."""
    prompt_ms = timings.get("prompt_ms")
    predicted_ms = timings.get("predicted_ms")
    return {
        "done": True,
        "done_reason": "length" if reason in ("length", "limit") else "stop",
        "total_duration": _ns(time.monotonic() - timing.arrived),
        "load_duration": _ns(timing.waited()),
        "prompt_eval_count": _count(usage.get("prompt_tokens"), timings.get("prompt_n")),
        "prompt_eval_duration": _ns(prompt_ms / 1000) if isinstance(prompt_ms, int | float) else 0,
        "eval_count": _count(usage.get("completion_tokens"), timings.get("predicted_n")),
        "eval_duration": _ns(predicted_ms / 1000) if isinstance(predicted_ms, int | float) else 0,
    }


def _head(exchange: Exchange) -> dict[str, Any]:
    return {"model": exchange.model, "created_at": created_at()}


def _text(
    exchange: Exchange, content: str, thinking: str | None = None, calls: list[Any] | None = None
) -> dict:
    """The generated part of a line: a ``message`` for /api/chat, a ``response`` for /api/generate."""
    if exchange.chat:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}
    out: dict[str, Any] = {"response": content}
    if thinking:
        out["thinking"] = thinking
    return out


def ollama_tool_calls(calls: Any) -> list[dict[str, Any]]:
    """OpenAI's tool calls (arguments as JSON text) as Ollama's (arguments as an object)."""
    out = []
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function", {}) if isinstance(call, dict) else {}
        text = function.get("arguments")
        try:
            arguments = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            arguments = {"arguments": text}  # not JSON: passed on as it came
        entry: dict[str, Any] = {
            "function": {"index": index, "name": function.get("name", ""), "arguments": arguments}
        }
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def idiom_reply(exchange: Exchange) -> dict[str, Any]:
    """The answer to the load or unload idiom."""
    reason = "unload" if exchange.kind is Kind.UNLOAD else "load"
    return {**_head(exchange), **_text(exchange, ""), "done": True, "done_reason": reason}


def whole_reply(exchange: Exchange, doc: Mapping[str, Any], timing: Timing) -> dict[str, Any]:
    """A replica's whole (not streamed) answer to ``exchange`` in Ollama's shape."""
    kind = exchange.kind
    if kind in (Kind.LOAD, Kind.UNLOAD):
        return idiom_reply(exchange)
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    timings = doc.get("timings") if isinstance(doc.get("timings"), dict) else {}
    if kind in (Kind.EMBED, Kind.EMBEDDING):
        vectors = [
            d.get("embedding", []) for d in sorted(doc.get("data", []), key=lambda d: d.get("index", 0))
        ]
        if kind is Kind.EMBEDDING:
            return {"embedding": vectors[0] if vectors else []}
        vectors = [shortened(v, exchange.dimensions) for v in vectors]
        done = done_fields(None, usage, timings, timing)
        keep = ("total_duration", "load_duration", "prompt_eval_count")
        return {"model": exchange.model, "embeddings": vectors, **{k: done[k] for k in keep}}
    if kind is Kind.INFILL:
        reason = doc.get("stop_type")
        counts = {
            "prompt_tokens": doc.get("tokens_evaluated"),
            "completion_tokens": doc.get("tokens_predicted"),
        }
        text = _text(exchange, str(doc.get("content", "")))
        return {**_head(exchange), **text, **done_fields(reason, counts, timings, timing)}
    choice = (doc.get("choices") or [{}])[0]
    reason = choice.get("finish_reason")
    if kind is Kind.TEXT:
        text = _text(exchange, str(choice.get("text", "")))
    else:
        message = choice.get("message") or {}
        calls = ollama_tool_calls(message.get("tool_calls"))
        text = _text(exchange, message.get("content") or "", message.get("reasoning_content"), calls)
    return {**_head(exchange), **text, **done_fields(reason, usage, timings, timing)}


def shortened(vector: list[float], dimensions: int | None) -> list[float]:
    """The first ``dimensions`` values of ``vector``, scaled back to length 1 (as /api/embed gives them)."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head


class StreamTranslator:
    """Server-sent events from a replica in, NDJSON lines out (see the module's description)."""

    def __init__(self, exchange: Exchange, timing: Timing) -> None:
        self.exchange = exchange
        self.timing = timing
        self._line = bytearray()
        self._reason: str | None = None
        self._usage: dict[str, Any] = {}
        self._timings: dict[str, Any] = {}
        self._calls: dict[int, dict[str, Any]] = {}
        self.finished = False

    def feed(self, chunk: bytes) -> bytes:
        out = bytearray()
        start = 0
        while not self.finished:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._line += chunk[start:]
                break
            self._line += chunk[start:end]
            out += self._take(bytes(self._line).rstrip(b"\r"))
            self._line.clear()
            start = end + 1
        return bytes(out)

    def close(self) -> bytes:
        """What ends the stream when the replica's events ran out without their end."""
        if self.finished:
            return b""
        self.finished = True
        return error_line(f"the reply of '{self.exchange.model}' ended before it was complete")

    def _take(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return b""  # comments (the wait's keep-alives), event names, blank lines
        data = line[5:].strip()
        if data == b"[DONE]":
            return self._finish()
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            return b""
        if not isinstance(event, dict):
            return b""
        found = error_text(event)
        if found is not None:
            self.finished = True
            return error_line(found[1])
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            self._timings = event["timings"]
        if self.exchange.kind is Kind.INFILL:
            return self._infill(event)
        choices = event.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        self._reason = choice.get("finish_reason") or self._reason
        if self.exchange.kind is Kind.TEXT:
            return self._line_of(str(choice.get("text") or ""), None)
        delta = choice.get("delta") or {}
        for call in delta.get("tool_calls") or []:
            self._add_call(call)
        return self._line_of(delta.get("content") or "", delta.get("reasoning_content"))

    def _infill(self, event: Mapping[str, Any]) -> bytes:
        text = self._line_of(str(event.get("content") or ""), None)
        if event.get("stop") is True:
            self._reason = event.get("stop_type")
            counts = {
                "prompt_tokens": event.get("tokens_evaluated"),
                "completion_tokens": event.get("tokens_predicted"),
            }
            self._usage = {k: v for k, v in counts.items() if v is not None}
            return text + self._finish()
        return text

    def _add_call(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        index = delta.get("index", len(self._calls))
        call = self._calls.setdefault(index, {"function": {"name": "", "arguments": ""}})
        if isinstance(delta.get("id"), str):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def _line_of(self, content: str, thinking: str | None) -> bytes:
        if not content and not thinking:
            return b""
        doc = {**_head(self.exchange), **_text(self.exchange, content, thinking), "done": False}
        return json.dumps(doc).encode() + b"\n"

    def _finish(self) -> bytes:
        self.finished = True
        out = b""
        if self._calls:
            calls = ollama_tool_calls([self._calls[i] for i in sorted(self._calls)])
            doc = {**_head(self.exchange), **_text(self.exchange, "", None, calls), "done": False}
            out = json.dumps(doc).encode() + b"\n"
        last = {
            **_head(self.exchange),
            **_text(self.exchange, ""),
            **done_fields(self._reason, self._usage, self._timings, self.timing),
        }
        return out + json.dumps(last).encode() + b"\n"
