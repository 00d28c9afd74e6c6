#!/usr/bin/env python3
"""A simulated llama-server: a real HTTP server process that speaks the parts of llama.cpp's server API the
router uses, with behaviour (load time, token rate, crashes, out-of-memory at load, ...) read from the model
file, which for the simulator is a small JSON document.

Run it as ``python tests/support/simserver --host 127.0.0.1 --port N -m MODEL.json -c CTX -np SLOTS ...``.
Unknown flags (``--flag value``, ``--flag=value`` or a bare ``--flag``) are accepted and ignored.
``--help`` (``-h``, ``--usage``) prints the flags llama-server b11434 accepts (``llama-server-help.txt``
next to this file) and exits, so the router's check of pass-through flags sees the flags a real
llama-server accepts.

Tokenisation rule, used everywhere (prompts, /tokenize, the prompt cache, context checks): one token per
whitespace-separated word (``str.split()``); a token's id is the CRC-32 of the word's UTF-8 bytes. Generated
token ``i`` of a reply has the text ``" tok{i}"`` (or the next word of the ``reply`` text), which is one
token under the same rule.

Errors follow llama-server b11434 where the router depends on them: JSON error bodies in its shape; an
empty 400 for a multipart body (cpp-httplib); 500s for some bodies that are the client's mistake (Anthropic
messages without ``messages``, ``tools`` that are not an array, a chat message without ``role``); and, with
``web_ui``, a page at ``/`` that answers 415 in plain text to a client that does not accept gzip.

Only the standard library is imported so that the process listens within a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BUILD_INFO = "b0-sim"
HELP_TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "llama-server-help.txt")
HELP_FLAGS = frozenset({"-h", "--help", "--usage"})
CHAT_TEMPLATE = "chatml"


# ----------------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the simulated model does; every field is an optional key of the model's JSON file."""

    name: str | None = None
    load_delay: float = 0.2
    tokens: int = 16
    token_rate: float | None = 50.0
    prompt_rate: float | None = None
    crash_after_tokens: int | None = None
    oom_at_load: bool = False
    oom_mib: float = 4096.0
    exit_at_load: int | None = None
    hang_health: bool = False
    ignore_sigterm: bool = False
    record_dir: str | None = None
    embedding_dim: int = 8
    reply: str | None = None
    n_ctx_train: int = 4096
    model_mib: float = 64.0
    # MiB this replica "holds" on each GPU it is shown, reported to a stand-in NVML through the file
    # $FAKE_NVML_PROCS_DIR/<pid> once loaded (None: report nothing).
    gpu_mib: float | None = None
    web_ui: bool = False


BEHAVIOUR_KEYS: frozenset[str] = frozenset(f.name for f in fields(Behaviour))
SIDECAR_SUFFIX = ".sim.json"


@dataclass(frozen=True, slots=True)
class Options:
    """The llama-server command-line flags the simulator reads."""

    host: str = "127.0.0.1"
    port: int = 8080
    model: str = ""
    ctx: int = 4096
    parallel: int = 1
    n_gpu_layers: int = -1
    metrics: bool = False
    alias: str | None = None


_VALUE_FLAGS: dict[str, str] = {
    "--host": "host",
    "--port": "port",
    "-m": "model",
    "--model": "model",
    "-c": "ctx",
    "--ctx-size": "ctx",
    "-np": "parallel",
    "--parallel": "parallel",
    "-ngl": "n_gpu_layers",
    "--gpu-layers": "n_gpu_layers",
    "--n-gpu-layers": "n_gpu_layers",
    "-a": "alias",
    "--alias": "alias",
}
_INT_FIELDS = frozenset({"port", "ctx", "parallel", "n_gpu_layers"})


def _looks_like_value(arg: str) -> bool:
    if not arg.startswith("-"):
        return True
    try:
        float(arg)
    except ValueError:
        return False
    return True


def parse_args(args: list[str]) -> Options:
    """Read the flags the simulator cares about; skip any other ``--flag [value]``."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, eq, inline = arg.partition("=")
        if name in _VALUE_FLAGS:
            if eq:
                value = inline
            elif i < len(args):
                value = args[i]
                i += 1
            else:
                raise SystemExit(f"error: {name} needs a value")
            key = _VALUE_FLAGS[name]
            found[key] = int(value) if key in _INT_FIELDS else value
        elif name == "--metrics":
            found["metrics"] = True
        elif arg.startswith("-") and not eq and i < len(args) and _looks_like_value(args[i]):
            i += 1  # an unknown flag with a value
    return Options(**found)


def load_behaviour(model_path: str) -> Behaviour:
    """The behaviour for a model file: the file itself when it is JSON; for a GGUF file, the JSON sidecar
    ``MODEL.gguf.sim.json`` when present, else the defaults. Raises OSError or ValueError when unusable."""
    with open(model_path, "rb") as f:
        head = f.read(4)
        if head == b"GGUF":
            sidecar = model_path + SIDECAR_SUFFIX
            if not os.path.exists(sidecar):
                return Behaviour()
            with open(sidecar, "rb") as g:
                raw = g.read()
        else:
            raw = head + f.read()
    data = json.loads(raw or b"{}")
    if not isinstance(data, dict):
        raise ValueError("the model file must hold a JSON object")
    unknown = sorted(set(data) - BEHAVIOUR_KEYS)
    if unknown:
        raise ValueError(f"unknown behaviour keys: {', '.join(unknown)}")
    return Behaviour(**data)


# ----------------------------------------------------------------------------------------------------------
# Logging


_LOG_LOCK = threading.Lock()


def log(line: str) -> None:
    with _LOG_LOCK:
        os.write(2, (line + "\n").encode("utf-8", "replace"))


# ----------------------------------------------------------------------------------------------------------
# Tokens and templates


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


# ----------------------------------------------------------------------------------------------------------
# Slots and the server-side queue


class Slot:
    __slots__ = ("busy", "cache", "id", "last_used", "n_cache", "task_id")

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.busy = False
        self.cache: list[int] = []
        self.last_used = 0.0
        self.n_cache = 0
        self.task_id = -1


class _Waiter:
    __slots__ = ("event", "id_slot", "prompt", "slot", "task_id")

    def __init__(self, prompt: list[int], id_slot: int, task_id: int) -> None:
        self.prompt = prompt
        self.id_slot = id_slot
        self.task_id = task_id
        self.event = threading.Event()
        self.slot: Slot | None = None


class SlotPool:
    """``n`` slots; requests wait in arrival order for an idle slot, chosen as llama-server does: the idle
    slot whose cached tokens share the longest prefix with the prompt, else the least recently used one."""

    SIMILARITY = 0.1

    def __init__(self, n_slots: int) -> None:
        self._lock = threading.Lock()
        self.slots = [Slot(i) for i in range(n_slots)]
        self._waiters: list[_Waiter] = []
        self._next_task = 0

    def snapshot(self) -> list[tuple[int, bool, int]]:
        with self._lock:
            return [(s.id, s.busy, s.task_id) for s in self.slots]

    def busy_count(self) -> int:
        with self._lock:
            return sum(s.busy for s in self.slots)

    def deferred_count(self) -> int:
        with self._lock:
            return len(self._waiters)

    def acquire(self, prompt: list[int], id_slot: int, gone: Callable[[], bool]) -> Slot | None:
        """Wait for a slot; None when ``gone()`` turns true first (the client went away)."""
        with self._lock:
            self._next_task += 1
            waiter = _Waiter(prompt, id_slot, self._next_task)
            self._waiters.append(waiter)
            self._dispatch()
        while not waiter.event.wait(0.05):
            if gone():
                with self._lock:
                    if waiter.slot is None:
                        self._waiters.remove(waiter)
                        return None
                self.release(waiter.slot, waiter.slot.cache)
                return None
        return waiter.slot

    def release(self, slot: Slot, cache: list[int]) -> None:
        with self._lock:
            slot.cache = cache
            slot.busy = False
            slot.task_id = -1
            slot.last_used = time.monotonic()
            self._dispatch()

    def _dispatch(self) -> None:
        for waiter in list(self._waiters):
            idle = [s for s in self.slots if not s.busy]
            if waiter.id_slot >= 0:
                idle = [s for s in idle if s.id == waiter.id_slot]
            if not idle:
                if waiter.id_slot < 0:
                    break
                continue
            slot = self._choose(idle, waiter.prompt)
            slot.busy = True
            slot.task_id = waiter.task_id
            slot.n_cache = min(common_prefix(slot.cache, waiter.prompt), max(len(waiter.prompt) - 1, 0))
            waiter.slot = slot
            self._waiters.remove(waiter)
            waiter.event.set()

    def _choose(self, idle: list[Slot], prompt: list[int]) -> Slot:
        best = max(idle, key=lambda s: common_prefix(s.cache, prompt))
        shared = common_prefix(best.cache, prompt)
        if prompt and shared and shared / len(prompt) >= self.SIMILARITY:
            return best
        return min(idle, key=lambda s: s.last_used)


# ----------------------------------------------------------------------------------------------------------
# Server state


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.prompt_seconds = 0.0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        self.n_decode = 0
        self.emitted_total = 0

    def add_request(self, prompt_n: int, prompt_s: float, predicted_n: int, predicted_s: float) -> None:
        with self._lock:
            self.prompt_tokens += prompt_n
            self.prompt_seconds += prompt_s
            self.predicted_tokens += predicted_n
            self.predicted_seconds += predicted_s
            self.n_decode += predicted_n + (1 if prompt_n else 0)

    def count_token(self) -> int:
        with self._lock:
            self.emitted_total += 1
            return self.emitted_total


class ServerState:
    def __init__(self, options: Options, behaviour: Behaviour | None, port: int) -> None:
        self.options = options
        self.behaviour = behaviour or Behaviour()
        self.port = port
        self.ready = threading.Event()
        parallel = max(options.parallel, 1)
        ctx = options.ctx if options.ctx > 0 else self.behaviour.n_ctx_train
        self.n_ctx = ctx
        self.n_ctx_slot = ctx // parallel
        self.pool = SlotPool(parallel)
        self.stats = Stats()
        base = os.path.basename(options.model)
        self.model_id = options.alias or self.behaviour.name or base or "model"

    def model_for(self, body: dict[str, Any]) -> str:
        requested = body.get("model")
        return requested if isinstance(requested, str) and requested else self.model_id


# ----------------------------------------------------------------------------------------------------------
# Jobs and generation results


class RequestError(Exception):
    def __init__(self, code: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "type": self.kind, **self.extra}}


@dataclass(frozen=True, slots=True)
class Job:
    prompt: list[int]
    n_out: int
    limited: bool
    stop: tuple[str, ...]
    stream: bool
    model: str
    id_slot: int = -1


@dataclass(slots=True)
class Generation:
    """The running / finished state of one generation, read by the reply shapes."""

    job: Job
    ident: str
    created: int
    slot_id: int = -1
    n_cache: int = 0
    pieces: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    finish: str = "stop"  # "stop" (end of text), "length" (max tokens) or "word" (a stop string)
    stop_word: str = ""
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0

    @property
    def n_prompt(self) -> int:
        return len(self.job.prompt)

    @property
    def n_out(self) -> int:
        return len(self.pieces)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def timings(self) -> dict[str, Any]:
        prompt_n = self.n_prompt - self.n_cache
        return {
            "cache_n": self.n_cache,
            "prompt_n": prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_token_ms": round(self.prompt_ms / prompt_n, 3) if prompt_n else 0.0,
            "prompt_per_second": round(prompt_n * 1e3 / self.prompt_ms, 3) if self.prompt_ms > 0 else 0.0,
            "predicted_n": self.n_out,
            "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_token_ms": round(self.predicted_ms / self.n_out, 3) if self.n_out else 0.0,
            "predicted_per_second": (
                round(self.n_out * 1e3 / self.predicted_ms, 3) if self.predicted_ms > 0 else 0.0
            ),
        }

    def openai_usage(self) -> dict[str, Any]:
        return {
            "completion_tokens": self.n_out,
            "prompt_tokens": self.n_prompt,
            "total_tokens": self.n_prompt + self.n_out,
            "prompt_tokens_details": {"cached_tokens": self.n_cache},
        }

    def openai_finish(self) -> str:
        return "length" if self.finish == "length" else "stop"


def sse(obj: Any, event: str | None = None) -> bytes:
    data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    return b"event: " + event.encode() + b"\n" + data if event else data


SSE_DONE = b"data: [DONE]\n\n"


class Shape:
    """How one endpoint dresses a generation: events before the first token, per token, at the end, and the
    non-streaming body."""

    def head(self, gen: Generation) -> list[bytes]:
        return []

    def token(self, gen: Generation, piece: str) -> list[bytes]:
        raise NotImplementedError

    def tail(self, gen: Generation) -> list[bytes]:
        raise NotImplementedError

    def body(self, gen: Generation) -> dict[str, Any]:
        raise NotImplementedError


class ChatShape(Shape):
    def _chunk(self, gen: Generation, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            "created": gen.created,
            "id": gen.ident,
            "model": gen.job.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion.chunk",
        }

    def head(self, gen: Generation) -> list[bytes]:
        return [sse(self._chunk(gen, {"role": "assistant", "content": None}, None))]

    def token(self, gen: Generation, piece: str) -> list[bytes]:
        return [sse(self._chunk(gen, {"content": piece}, None))]

    def tail(self, gen: Generation) -> list[bytes]:
        last = self._chunk(gen, {}, gen.openai_finish())
        last["usage"] = gen.openai_usage()
        last["timings"] = gen.timings()
        return [sse(last), SSE_DONE]

    def body(self, gen: Generation) -> dict[str, Any]:
        return {
            "choices": [
                {
                    "finish_reason": gen.openai_finish(),
                    "index": 0,
                    "message": {"role": "assistant", "content": gen.text},
                }
            ],
            "created": gen.created,
            "model": gen.job.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion",
            "usage": gen.openai_usage(),
            "id": gen.ident,
            "timings": gen.timings(),
        }


class CompletionShape(Shape):
    def _reply(self, gen: Generation, text: str, finish: str | None) -> dict[str, Any]:
        return {
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            "created": gen.created,
            "model": gen.job.model,
            "system_fingerprint": BUILD_INFO,
            "object": "text_completion",
            "id": gen.ident,
        }

    def token(self, gen: Generation, piece: str) -> list[bytes]:
        return [sse(self._reply(gen, piece, None))]

    def tail(self, gen: Generation) -> list[bytes]:
        last = self._reply(gen, "", gen.openai_finish())
        last["usage"] = gen.openai_usage()
        last["timings"] = gen.timings()
        return [sse(last), SSE_DONE]

    def body(self, gen: Generation) -> dict[str, Any]:
        reply = self._reply(gen, gen.text, gen.openai_finish())
        reply["usage"] = gen.openai_usage()
        reply["timings"] = gen.timings()
        return reply


class NativeShape(Shape):
    """llama.cpp's own /completion and /infill replies."""

    def _stop_type(self, gen: Generation) -> str:
        return {"length": "limit", "word": "word"}.get(gen.finish, "eos")

    def token(self, gen: Generation, piece: str) -> list[bytes]:
        return [
            sse(
                {
                    "index": 0,
                    "content": piece,
                    "tokens": [gen.ids[-1]] if gen.ids else [],
                    "stop": False,
                    "id_slot": gen.slot_id,
                    "tokens_predicted": gen.n_out,
                    "tokens_evaluated": gen.n_prompt,
                }
            )
        ]

    def _final(self, gen: Generation, content: str) -> dict[str, Any]:
        return {
            "index": 0,
            "content": content,
            "tokens": [] if gen.job.stream else list(gen.ids),
            "id_slot": gen.slot_id,
            "stop": True,
            "model": gen.job.model,
            "tokens_predicted": gen.n_out,
            "tokens_evaluated": gen.n_prompt,
            "tokens_cached": gen.n_cache + gen.n_out,
            "truncated": False,
            "stop_type": self._stop_type(gen),
            "stopping_word": gen.stop_word,
            "timings": gen.timings(),
        }

    def tail(self, gen: Generation) -> list[bytes]:
        return [sse(self._final(gen, ""))]

    def body(self, gen: Generation) -> dict[str, Any]:
        return self._final(gen, gen.text)


class MessagesShape(Shape):
    """Anthropic's Messages API."""

    def _stop_reason(self, gen: Generation) -> str:
        return {"length": "max_tokens", "word": "stop_sequence"}.get(gen.finish, "end_turn")

    def head(self, gen: Generation) -> list[bytes]:
        message = {
            "id": gen.ident,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": gen.job.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": gen.n_prompt, "output_tokens": 0},
        }
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return [
            sse({"type": "message_start", "message": message}, "message_start"),
            sse(block, "content_block_start"),
        ]

    def token(self, gen: Generation, piece: str) -> list[bytes]:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
        return [sse(delta, "content_block_delta")]

    def tail(self, gen: Generation) -> list[bytes]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(gen), "stop_sequence": gen.stop_word or None},
            "usage": {"output_tokens": gen.n_out},
            "timings": gen.timings(),
        }
        return [
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            sse(delta, "message_delta"),
            sse({"type": "message_stop"}, "message_stop"),
        ]

    def body(self, gen: Generation) -> dict[str, Any]:
        return {
            "id": gen.ident,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": gen.text}],
            "model": gen.job.model,
            "stop_reason": self._stop_reason(gen),
            "stop_sequence": gen.stop_word or None,
            "usage": {"input_tokens": gen.n_prompt, "output_tokens": gen.n_out},
            "timings": gen.timings(),
        }


class ResponsesShape(Shape):
    """A minimal OpenAI Responses API."""

    def __init__(self) -> None:
        self._seq = 0

    def _event(self, kind: str, **payload: Any) -> bytes:
        self._seq += 1
        return sse({"type": kind, "sequence_number": self._seq, **payload}, kind)

    def _item_id(self, gen: Generation) -> str:
        return "msg_" + gen.ident.removeprefix("resp_")

    def _item(self, gen: Generation, done: bool) -> dict[str, Any]:
        content = [{"type": "output_text", "text": gen.text, "annotations": []}] if done else []
        return {
            "type": "message",
            "id": self._item_id(gen),
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": content,
        }

    def _response(self, gen: Generation, done: bool) -> dict[str, Any]:
        response: dict[str, Any] = {
            "id": gen.ident,
            "object": "response",
            "created_at": gen.created,
            "status": "in_progress",
            "model": gen.job.model,
            "output": [],
            "incomplete_details": None,
        }
        if done:
            response["status"] = "incomplete" if gen.finish == "length" else "completed"
            if gen.finish == "length":
                response["incomplete_details"] = {"reason": "max_output_tokens"}
            response["output"] = [self._item(gen, True)]
            response["usage"] = {
                "input_tokens": gen.n_prompt,
                "input_tokens_details": {"cached_tokens": gen.n_cache},
                "output_tokens": gen.n_out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": gen.n_prompt + gen.n_out,
            }
            response["timings"] = gen.timings()
        return response

    def head(self, gen: Generation) -> list[bytes]:
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.created", response=self._response(gen, False)),
            self._event("response.in_progress", response=self._response(gen, False)),
            self._event("response.output_item.added", output_index=0, item=self._item(gen, False)),
            self._event(
                "response.content_part.added",
                item_id=self._item_id(gen),
                output_index=0,
                content_index=0,
                part=part,
            ),
        ]

    def token(self, gen: Generation, piece: str) -> list[bytes]:
        return [
            self._event(
                "response.output_text.delta",
                item_id=self._item_id(gen),
                output_index=0,
                content_index=0,
                delta=piece,
            )
        ]

    def tail(self, gen: Generation) -> list[bytes]:
        item_id = self._item_id(gen)
        part = {"type": "output_text", "text": gen.text, "annotations": []}
        final = self._response(gen, True)
        return [
            self._event(
                "response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=gen.text
            ),
            self._event(
                "response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part
            ),
            self._event("response.output_item.done", output_index=0, item=self._item(gen, True)),
            self._event(
                "response.incomplete" if final["status"] == "incomplete" else "response.completed",
                response=final,
            ),
        ]

    def body(self, gen: Generation) -> dict[str, Any]:
        return self._response(gen, True)


# ----------------------------------------------------------------------------------------------------------
# Request parsing helpers


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RequestError(400, f"invalid integer value: {value!r}") from None


def _stop_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str) and s)
    raise RequestError(400, "'stop' must be a string or a list of strings")


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list):
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if prompt and isinstance(prompt[0], str | list):
            return _prompt_ids(prompt[0])
    if prompt is None:
        raise RequestError(400, "'prompt' is required")
    raise RequestError(400, "'prompt' must be a string or a list of tokens")


# ----------------------------------------------------------------------------------------------------------
# HTTP


def peer_gone(sock: socket.socket, wait: float = 0.0) -> bool:
    """Wait up to ``wait`` seconds; True as soon as the peer has closed (or reset) the connection."""
    deadline = time.monotonic() + wait
    while True:
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            readable, _, _ = select.select([sock], [], [], remaining)
            if not readable:
                return False
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                return True
        except BlockingIOError:
            continue
        except (OSError, ValueError):
            return True
        # Bytes are waiting (a pipelined request): the connection is alive; sit out the rest.
        time.sleep(max(deadline - time.monotonic(), 0.0))
        return False


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    state: ServerState

    def handle_error(self, request: Any, client_address: Any) -> None:
        log(f"srv  log_server_r: connection error from {client_address}: {sys.exc_info()[1]!r}")


_QUIET_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/slots", "/props"})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llama.cpp"
    sys_version = ""
    disable_nagle_algorithm = True
    server: SimHTTPServer
    _streaming: bool = False

    # -- plumbing --------------------------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self.server.state

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = self.path.split("?", 1)[0]
        if path not in _QUIET_PATHS:
            log(f"srv  log_server_r: request: {self.command} {path} {self.client_address[0]} {code}")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> dict[str, Any]:
        raw = self._read_body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise RequestError(400, f"Invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        return body

    def _send(self, code: int, payload: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self._send_cors()
        self.end_headers()
        self.wfile.write(payload)

    def _send_cors(self) -> None:
        """Like llama-server: reflect the caller's Origin, whoever it is (the router must not pass it on)."""
        origin = self.headers.get("Origin")
        self.send_header("Access-Control-Allow-Origin", origin or "*")
        if origin:
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.send_header("Vary", "Origin")

    def send_json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json; charset=utf-8")

    def send_error_obj(self, err: RequestError) -> None:
        self.send_json(err.code, err.body())

    def _gone(self) -> bool:
        return peer_gone(self.connection)

    def _write_chunk(self, data: bytes) -> bool:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError:
            return False
        return True

    # -- dispatch --------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(GET_ROUTES)

    def do_POST(self) -> None:
        self._dispatch(POST_ROUTES)

    def _dispatch(self, routes: dict[str, Callable[[Handler], None]]) -> None:
        path = self.path.split("?", 1)[0]
        self._streaming = False
        if path in ("/health", "/v1/health") and self.state.behaviour.hang_health:
            self.close_connection = True
            while True:
                time.sleep(3600)
        try:
            if not self.state.ready.is_set():
                self._read_body()
                raise RequestError(503, "Loading model", "unavailable_error")
            if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
                self._read_body()  # cpp-httplib refuses a multipart body it cannot parse: empty 400
                self.close_connection = True
                self._send(400, b"", "text/plain")
                return
            route = routes.get(path)
            if route is None:
                self._read_body()
                raise RequestError(404, "File Not Found", "not_found_error")
            route(self)
        except RequestError as err:
            self.send_error_obj(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            log(f"srv  log_server_r: internal error on {self.command} {path}: {exc!r}")
            self.close_connection = True
            if not self._streaming:
                self.send_error_obj(RequestError(500, f"internal error: {exc!r}", "server_error"))

    # -- simple endpoints ------------------------------------------------------------------------------

    def route_health(self) -> None:
        self.send_json(200, {"status": "ok"})

    def route_web_ui(self) -> None:
        if not self.state.behaviour.web_ui:
            raise RequestError(404, "File Not Found", "not_found_error")
        if "gzip" not in self.headers.get("Accept-Encoding", ""):
            self._send(415, b"Error: gzip is not supported by this browser", "text/plain")
            return
        self._send(200, b"<!doctype html><title>llama.cpp (simulated)</title>", "text/html")

    def route_slots(self) -> None:
        self.send_json(
            200,
            [
                {
                    "id": slot_id,
                    "id_task": task_id,
                    "n_ctx": self.state.n_ctx_slot,
                    "speculative": False,
                    "is_processing": busy,
                }
                for slot_id, busy, task_id in self.state.pool.snapshot()
            ],
        )

    def route_props(self) -> None:
        state = self.state
        self.send_json(
            200,
            {
                "default_generation_settings": {
                    "id": 0,
                    "id_task": -1,
                    "n_ctx": state.n_ctx_slot,
                    "speculative": False,
                    "is_processing": False,
                    "params": {"n_predict": -1, "temperature": 0.8, "stream": False},
                },
                "total_slots": len(state.pool.slots),
                "model_path": state.options.model,
                "model_alias": state.model_id,
                "modalities": {"vision": False, "audio": False},
                "chat_template": CHAT_TEMPLATE,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "build_info": BUILD_INFO,
            },
        )

    def route_models(self) -> None:
        state = self.state
        meta = {"n_ctx_train": state.behaviour.n_ctx_train, "n_ctx": state.n_ctx, "vocab_type": 1}
        self.send_json(
            200,
            {
                "models": [{"name": state.model_id, "model": state.model_id, "type": "model"}],
                "object": "list",
                "data": [
                    {
                        "id": state.model_id,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "llamacpp",
                        "meta": meta,
                    }
                ],
            },
        )

    def route_metrics(self) -> None:
        state = self.state
        if not state.options.metrics:
            raise RequestError(
                501,
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            )
        st = state.stats
        prompt_tps = st.prompt_tokens / st.prompt_seconds if st.prompt_seconds else 0.0
        predicted_tps = st.predicted_tokens / st.predicted_seconds if st.predicted_seconds else 0.0
        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", st.prompt_tokens),
            ("prompt_seconds_total", "counter", "Prompt process time", st.prompt_seconds),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                st.predicted_tokens,
            ),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", st.predicted_seconds),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", st.n_decode),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_tps),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                predicted_tps,
            ),
            ("requests_processing", "gauge", "Number of requests processing.", state.pool.busy_count()),
            ("requests_deferred", "gauge", "Number of requests deferred.", state.pool.deferred_count()),
        ]
        lines = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}"]
            lines.append(f"llamacpp:{name} {value}")
        self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")

    def route_tokenize(self) -> None:
        body = self._json_body()
        content = body.get("content", "")
        words = content.split() if isinstance(content, str) else []
        ids = [token_id(w) for w in words]
        if body.get("with_pieces"):
            self.send_json(200, {"tokens": [{"id": i, "piece": w} for i, w in zip(ids, words, strict=True)]})
        else:
            self.send_json(200, {"tokens": ids})

    def route_detokenize(self) -> None:
        body = self._json_body()
        tokens = body.get("tokens") or []
        self.send_json(200, {"content": detokenize(int(t) for t in tokens)})

    def route_apply_template(self) -> None:
        body = self._json_body()
        self.send_json(200, {"prompt": render_chat(body.get("messages") or [])})

    def route_count_tokens(self) -> None:
        body = self._json_body()
        self.send_json(200, {"input_tokens": len(tokenize(self._anthropic_prompt(body)))})

    # -- slot-holding endpoints without generation -------------------------------------------------------

    def _with_slot(self, prompt: list[int]) -> bool:
        slot = self.state.pool.acquire(prompt, -1, self._gone)
        if slot is None:
            self.close_connection = True
            return False
        self.state.pool.release(slot, prompt)
        self.state.stats.add_request(len(prompt), 0.0, 0, 0.0)
        return True

    def route_embeddings(self) -> None:
        body = self._json_body()
        inputs = body.get("input", body.get("content"))
        if inputs is None:
            raise RequestError(400, "'input' or 'content' is required")
        items = (
            inputs if isinstance(inputs, list) and not all(isinstance(t, int) for t in inputs) else [inputs]
        )
        texts = [item if isinstance(item, str) else detokenize(item) for item in items]
        ids = [tokenize(t) for t in texts]
        n_tokens = sum(len(i) for i in ids)
        if not self._with_slot([t for i in ids for t in i]):
            return
        dim = self.state.behaviour.embedding_dim
        vectors = [embedding_for(t, dim) for t in texts]
        if self.path.startswith("/embedding") and not self.path.startswith("/embeddings"):
            self.send_json(200, [{"index": n, "embedding": [v]} for n, v in enumerate(vectors)])
            return
        self.send_json(
            200,
            {
                "model": self.state.model_for(body),
                "object": "list",
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                "data": [{"embedding": v, "index": n, "object": "embedding"} for n, v in enumerate(vectors)],
            },
        )

    def route_rerank(self) -> None:
        body = self._json_body()
        query = body.get("query")
        documents = body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list):
            raise RequestError(400, "'query' (string) and 'documents' (list) are required")
        texts = [text_of(d) for d in documents]
        prompt = [t for d in texts for t in tokenize(query + " " + d)]
        if not self._with_slot(prompt):
            return
        results: list[dict[str, Any]] = [
            {"index": n, "relevance_score": rerank_score(query, d)} for n, d in enumerate(texts)
        ]
        if body.get("return_text") or body.get("return_documents"):
            for r in results:
                r["document"] = {"text": texts[r["index"]]}
        results.sort(key=lambda r: -r["relevance_score"])
        top_n = _int_or_none(body.get("top_n"))
        if top_n is not None:
            results = results[:top_n]
        self.send_json(
            200,
            {
                "model": self.state.model_for(body),
                "object": "list",
                "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt)},
                "results": results,
            },
        )

    # -- generation endpoints ----------------------------------------------------------------------------

    def _job(self, body: dict[str, Any], prompt: list[int], requested: Any, stop: Any) -> Job:
        behaviour = self.state.behaviour
        limit = _int_or_none(requested)
        if limit is None or limit < 0:
            n_out, limited = behaviour.tokens, False
        else:
            n_out, limited = min(limit, behaviour.tokens), limit < behaviour.tokens
        id_slot = _int_or_none(body.get("id_slot"))
        return Job(
            prompt=prompt,
            n_out=max(n_out, 0),
            limited=limited,
            stop=_stop_list(stop),
            stream=bool(body.get("stream")),
            model=self.state.model_for(body),
            id_slot=-1 if id_slot is None else id_slot,
        )

    def route_chat_completions(self) -> None:
        body = self._json_body()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' is required and must be a non-empty list")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            shown = json.dumps(tools, ensure_ascii=False)  # nlohmann's dump() does not escape either
            raise RequestError(
                500, f"Failed to parse tools: Expected 'tools' to be an array, got {shown}", "server_error"
            )
        for message in messages:
            if isinstance(message, dict) and "role" not in message:
                shown = json.dumps(message, ensure_ascii=False)
                raise RequestError(
                    500, f"Failed to parse messages: Missing 'role' in message: {shown}", "server_error"
                )
        requested = body.get("max_completion_tokens", body.get("max_tokens", body.get("n_predict")))
        job = self._job(body, tokenize(render_chat(messages)), requested, body.get("stop"))
        self._generate(job, ChatShape(), "chatcmpl-")

    def route_completions(self) -> None:
        body = self._json_body()
        requested = body.get("max_tokens", body.get("n_predict"))
        job = self._job(body, _prompt_ids(body.get("prompt")), requested, body.get("stop"))
        self._generate(job, CompletionShape(), "cmpl-")

    def route_completion_native(self) -> None:
        body = self._json_body()
        requested = body.get("n_predict", body.get("max_tokens"))
        job = self._job(body, _prompt_ids(body.get("prompt")), requested, body.get("stop"))
        self._generate(job, NativeShape(), "")

    def route_infill(self) -> None:
        body = self._json_body()
        extra = " ".join(text_of(chunk) for chunk in body.get("input_extra") or [])
        text = " ".join(
            part
            for part in (
                extra,
                "<|fim_prefix|>",
                str(body.get("input_prefix", "")),
                "<|fim_suffix|>",
                str(body.get("input_suffix", "")),
                "<|fim_middle|>",
                str(body.get("prompt", "")),
            )
            if part
        )
        requested = body.get("n_predict", body.get("max_tokens"))
        job = self._job(body, tokenize(text), requested, body.get("stop"))
        self._generate(job, NativeShape(), "")

    def _anthropic_prompt(self, body: dict[str, Any]) -> str:
        messages = body.get("messages")
        if messages is None:
            raise RequestError(500, "'messages' is required", "server_error")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' is required and must be a non-empty list")
        system = body.get("system")
        full = ([{"role": "system", "content": text_of(system)}] if system else []) + messages
        return render_chat(full)

    def route_messages(self) -> None:
        body = self._json_body()
        prompt = tokenize(self._anthropic_prompt(body))
        job = self._job(body, prompt, body.get("max_tokens"), body.get("stop_sequences"))
        self._generate(job, MessagesShape(), "msg_")

    def route_responses(self) -> None:
        body = self._json_body()
        given = body.get("input")
        if isinstance(given, str):
            messages: list[dict[str, Any]] = [{"role": "user", "content": given}]
        elif isinstance(given, list) and given:
            messages = [
                item if isinstance(item, dict) and "role" in item else {"role": "user", "content": item}
                for item in given
            ]
        else:
            raise RequestError(400, "'input' is required")
        if body.get("instructions"):
            messages = [{"role": "system", "content": text_of(body["instructions"])}, *messages]
        job = self._job(body, tokenize(render_chat(messages)), body.get("max_output_tokens"), None)
        self._generate(job, ResponsesShape(), "resp_")

    def _generate(self, job: Job, shape: Shape, id_prefix: str) -> None:
        state = self.state
        behaviour = state.behaviour
        n_prompt = len(job.prompt)
        if n_prompt + job.n_out > state.n_ctx_slot or (n_prompt >= state.n_ctx_slot > 0):
            raise RequestError(
                400,
                "the request exceeds the available context size, try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=n_prompt,
                n_ctx=state.n_ctx_slot,
            )
        slot = state.pool.acquire(job.prompt, job.id_slot, self._gone)
        if slot is None:
            self.close_connection = True
            log("srv  operator(): client gone while the request was waiting for a slot")
            return
        gen = Generation(
            job=job,
            ident=id_prefix + os.urandom(12).hex(),
            created=int(time.time()),
            slot_id=slot.id,
            n_cache=slot.n_cache,
        )
        log(f"slot launch_slot_: id {slot.id:2d} | task {slot.task_id} | processing task")
        cancelled = False
        try:
            cancelled = not self._run(gen, shape, behaviour)
        finally:
            state.pool.release(slot, job.prompt + gen.ids)
            state.stats.add_request(
                n_prompt - gen.n_cache, gen.prompt_ms / 1e3, gen.n_out, gen.predicted_ms / 1e3
            )
            how = "cancelled" if cancelled else "stop processing"
            log(f"slot      release: id {slot.id:2d} | {how}: n_past = {n_prompt + gen.n_out}")

    def _run(self, gen: Generation, shape: Shape, behaviour: Behaviour) -> bool:
        """Process the prompt, then produce the tokens; False when the client went away."""
        job = gen.job
        sock = self.connection
        started = time.monotonic()
        n_eval = gen.n_prompt - gen.n_cache
        if behaviour.prompt_rate and n_eval and peer_gone(sock, n_eval / behaviour.prompt_rate):
            self.close_connection = True
            return False
        t0 = time.monotonic()
        gen.prompt_ms = max((t0 - started) * 1e3, 0.001 * n_eval)
        if job.stream:
            self._streaming = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self._send_cors()
            self.end_headers()
            head = b"".join(shape.head(gen))
            if head and not self._write_chunk(head):
                self.close_connection = True
                return False
        reply_words = behaviour.reply.split() if behaviour.reply else []
        rate = behaviour.token_rate
        finish = "length" if job.limited else "stop"
        for i in range(job.n_out):
            if rate and rate > 0:
                if peer_gone(sock, max(t0 + (i + 1) / rate - time.monotonic(), 0.0)):
                    self.close_connection = True
                    return False
            elif peer_gone(sock):
                self.close_connection = True
                return False
            word = reply_words[i % len(reply_words)] if reply_words else f"tok{i}"
            piece = " " + word
            hit = self._stop_hit(gen.text, piece, job.stop)
            if hit is not None:
                piece, gen.stop_word = hit
                finish = "word"
            gen.predicted_ms = (time.monotonic() - t0) * 1e3
            if piece:
                gen.pieces.append(piece)
                gen.ids.append(token_id(word))
                if job.stream and not self._write_chunk(b"".join(shape.token(gen, piece))):
                    self.close_connection = True
                    return False
                total = self.state.stats.count_token()
                crash_after = behaviour.crash_after_tokens
                if crash_after is not None and total >= crash_after:
                    log(f"CUDA error: an illegal memory access was encountered (after {total} tokens)")
                    log("/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error")
                    os._exit(1)
            if finish == "word":
                break
        gen.finish = finish
        gen.predicted_ms = max((time.monotonic() - t0) * 1e3, 0.001 * gen.n_out)
        if job.stream:
            ok = self._write_chunk(b"".join(shape.tail(gen))) and self._write_chunk(b"")
            if not ok:
                self.close_connection = True
                return False
        else:
            self.send_json(200, shape.body(gen))
        return True

    @staticmethod
    def _stop_hit(text: str, piece: str, stops: tuple[str, ...]) -> tuple[str, str] | None:
        """When ``piece`` completes a stop string: the part of it to emit and the stop string."""
        joined = text + piece
        best: tuple[int, str] | None = None
        for stop in stops:
            at = joined.find(stop, max(len(text) - len(stop) + 1, 0))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return None
        return joined[len(text) : best[0]] if best[0] > len(text) else "", best[1]


GET_ROUTES: dict[str, Callable[[Handler], None]] = {
    "/": Handler.route_web_ui,
    "/health": Handler.route_health,
    "/v1/health": Handler.route_health,
    "/slots": Handler.route_slots,
    "/props": Handler.route_props,
    "/models": Handler.route_models,
    "/v1/models": Handler.route_models,
    "/metrics": Handler.route_metrics,
}

POST_ROUTES: dict[str, Callable[[Handler], None]] = {
    "/completion": Handler.route_completion_native,
    "/completions": Handler.route_completions,
    "/v1/completions": Handler.route_completions,
    "/chat/completions": Handler.route_chat_completions,
    "/v1/chat/completions": Handler.route_chat_completions,
    "/infill": Handler.route_infill,
    "/tokenize": Handler.route_tokenize,
    "/detokenize": Handler.route_detokenize,
    "/apply-template": Handler.route_apply_template,
    "/embedding": Handler.route_embeddings,
    "/embeddings": Handler.route_embeddings,
    "/v1/embeddings": Handler.route_embeddings,
    "/rerank": Handler.route_rerank,
    "/reranking": Handler.route_rerank,
    "/v1/rerank": Handler.route_rerank,
    "/v1/reranking": Handler.route_rerank,
    "/v1/messages": Handler.route_messages,
    "/v1/messages/count_tokens": Handler.route_count_tokens,
    "/v1/responses": Handler.route_responses,
    "/responses": Handler.route_responses,
}


# ----------------------------------------------------------------------------------------------------------
# Start-up, model "loading" and shutdown


def _device_name(options: Options) -> str:
    if options.n_gpu_layers == 0:
        return "CPU"
    for var, prefix in (("HIP_VISIBLE_DEVICES", "ROCm"), ("CUDA_VISIBLE_DEVICES", "CUDA")):
        if os.environ.get(var, "").strip() not in ("", "-1"):
            return prefix + "0"
    return "CPU"


def _fail_load(path: str, reason: str, code: int = 1) -> None:
    log(f"llama_model_load: error loading model: {reason}")
    log("llama_model_load_from_file_impl: failed to load model")
    log(f"common_init_from_params: failed to load model '{path}'")
    log(f"srv    load_model: failed to load model, '{path}'")
    log("srv    operator(): operator(): cleaning up before exit...")
    log("main: exiting due to model loading error")
    os._exit(code)


def _load(state: ServerState, problem: str | None) -> None:
    options, behaviour = state.options, state.behaviour
    path = options.model
    log(f"srv    load_model: loading model '{path}'")
    if problem is not None:
        log(f"gguf_init_from_file: failed to open GGUF file '{path}' ({problem})")
        _fail_load(path, f"llama_model_loader: failed to load model from {path}")
    time.sleep(max(behaviour.load_delay, 0.0))
    device = _device_name(options)
    if behaviour.oom_at_load:
        mib = behaviour.oom_mib
        log(
            f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {mib:.2f} MiB on device 0: "
            "cudaMalloc failed: out of memory"
        )
        log(f"alloc_tensor_range: failed to allocate {device} buffer of size {int(mib * 1024 * 1024)}")
        _fail_load(path, f"unable to allocate {device} buffer")
    if behaviour.exit_at_load is not None:
        log("llama_model_load: error loading model: simulated load failure")
        _fail_load(path, "simulated load failure", behaviour.exit_at_load)
    _report_gpu_memory(behaviour)
    kv_mib = state.n_ctx / 1024 * 16.0
    log(f"load_tensors: {device:>12} model buffer size = {behaviour.model_mib:9.2f} MiB")
    log(f"llama_context: n_ctx = {state.n_ctx}, n_seq_max = {len(state.pool.slots)}")
    log(f"llama_kv_cache: {device:>12} KV buffer size = {kv_mib:9.2f} MiB")
    log(f"llama_context: {device:>12} compute buffer size = {32.0:9.2f} MiB")
    log(f"srv          init: initializing slots, n_slots = {len(state.pool.slots)}")
    state.ready.set()
    log("main: model loaded")
    log(f"main: server is listening on http://{options.host}:{state.port} - starting the main loop")
    log("srv  update_slots: all slots are idle")


def _report_gpu_memory(behaviour: Behaviour) -> None:
    """Tell a stand-in NVML that this process holds ``gpu_mib`` on every GPU it was shown."""
    procs = os.environ.get("FAKE_NVML_PROCS_DIR")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if behaviour.gpu_mib is None or not procs or not visible.strip():
        return
    lines = "".join(f"{gpu.strip()} {behaviour.gpu_mib:.0f}\n" for gpu in visible.split(","))
    tmp = os.path.join(procs, f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(lines)
    os.replace(tmp, os.path.join(procs, str(os.getpid())))


def _write_record(record_dir: str, state: ServerState, argv: list[str]) -> None:
    os.makedirs(record_dir, exist_ok=True)
    pid = os.getpid()
    record = {
        "argv": argv,
        "env": {"CUDA_VISIBLE_DEVICES": None, "HIP_VISIBLE_DEVICES": None, **os.environ},
        "pid": pid,
        "port": state.port,
        "model": state.options.model,
        "started": time.time(),
    }
    tmp = os.path.join(record_dir, f".{pid}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(record_dir, f"{pid}.json"))


def _on_sigterm(signum: int, frame: Any) -> None:
    log("srv    operator(): operator(): cleaning up before exit...")
    os._exit(0)


def main(argv: list[str]) -> int:
    if HELP_FLAGS & set(argv[1:]):
        with open(HELP_TEXT, "rb") as f:
            sys.stdout.buffer.write(f.read())
        sys.stdout.flush()
        return 0
    options = parse_args(argv[1:])
    problem: str | None = None
    behaviour: Behaviour | None = None
    try:
        behaviour = load_behaviour(options.model)
    except FileNotFoundError:
        problem = "No such file or directory"
    except (OSError, ValueError, TypeError) as exc:
        log(f"error: bad simulated model file '{options.model}': {exc}")
        return 1
    if behaviour is not None and behaviour.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, _on_sigterm)
    log(f"build: 0 ({BUILD_INFO}) with python {sys.version.split()[0]} for simulation")
    log("main: binding port with default address family")
    try:
        server = SimHTTPServer((options.host, options.port), Handler)
    except OSError as exc:
        log(f"main: couldn't bind HTTP server socket, hostname: {options.host}, port: {options.port} ({exc})")
        return 1
    port = server.server_address[1]
    state = ServerState(options, behaviour, port)
    server.state = state
    if state.behaviour.record_dir:
        _write_record(state.behaviour.record_dir, state, argv)
    log(f"main: HTTP server is listening, hostname: {options.host}, port: {port}, http threads: 16")
    log("main: loading model")
    threading.Thread(target=_load, args=(state, problem), daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
