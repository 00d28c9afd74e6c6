"""The generation side of the synthetic llama-server (``benchmarks/synthetic_replica.py``): the HTTP head and
chunk framing llama-server b11434 writes, and one generation, its events built when the request arrives in
llama-server's key order and written one HTTP chunk per token on an absolute schedule."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.synthetic_replica import Connection

BUILD_INFO = "b11434-unknown"
WORDS = (" degree", " Later", " ah", " dash", "Ah", " Survey", " river", " on", " the", " garden", ",", " a")
ROLE = '{"role":"assistant","content":null}'
KEEP_ALIVE_S = 5.0  # llama-server (cpp-httplib) closes a connection idle this long ...
KEEP_ALIVE_MAX = 100  # ... or after this many requests on it


def head(status: str, content_type: str, length: int | None, close: bool) -> bytes:
    """A response head as llama-server writes it (``length`` None: a chunked event stream)."""
    lines = [f"HTTP/1.1 {status}", "Server: llama.cpp", "Access-Control-Allow-Origin: "]
    if length is None:
        lines += ["X-Accel-Buffering: no", f"Content-Type: {content_type}", "Transfer-Encoding: chunked"]
    else:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {length}"]
    lines.append(
        "Connection: close" if close else f"Keep-Alive: timeout={KEEP_ALIVE_S:g}, max={KEEP_ALIVE_MAX}"
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def http_chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def render(messages: list[Any]) -> str:
    """Messages in the capture's chat template (ChatML)."""
    return "".join(
        f"<|im_start|>{m.get('role', '')}\n{m.get('content', '')}<|im_end|>\n"
        for m in messages
        if isinstance(m, dict)
    )


def number(body: dict[str, Any], key: str, default: float | None) -> float | None:
    value = body.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


class Stream:
    """One generation: its chunks built when it arrives, then written one per tick of its schedule."""

    def __init__(self, conn: Connection, body: dict[str, Any], *, chat: bool, close: bool) -> None:
        replica = conn.replica
        self.conn, self.chat, self.close = conn, chat, close
        self.streamed = bool(body.get("stream"))
        options = body.get("stream_options")
        self.usage_chunk = isinstance(options, dict) and bool(options.get("include_usage"))
        limit = next(
            (body[k] for k in ("max_tokens", "max_completion_tokens", "n_predict") if k in body), None
        )
        limited = isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0
        self.n = int(limit) if limited else replica.tokens
        self.finish = "length" if limited else "stop"
        self.rate = number(body, "synthetic_rate", replica.rate) or 0.0
        self.ttft = (number(body, "synthetic_ttft_ms", replica.ttft_ms) or 0.0) / 1000.0
        self.ident = replica.next_id()
        self.created = int(time.time())
        messages = body.get("messages")
        prompt = render(messages) if chat and isinstance(messages, list) else body.get("prompt")
        self.n_prompt = max(len(str(prompt or "").split()), 1) + (8 if chat else 0)
        created, model = f'"created":{self.created}', f'"model":{replica.model_json}'
        fingerprint = f'"system_fingerprint":"{BUILD_INFO}"'
        self.common = f'{created},"id":"{self.ident}",{model},{fingerprint}'  # chat chunks
        self.common_text = f"{created},{model},{fingerprint}"  # completion chunks: the id comes last
        self.pieces = self._pieces(number(body, "synthetic_chunk_bytes", replica.chunk_bytes))
        self.chunks = [http_chunk(self._event(piece)) for piece in self.pieces] if self.streamed else []
        self.k = 0
        self.t0 = self.started = 0.0
        self.stalled = self.gone = False
        self.timer: asyncio.Handle | None = None

    def _event(self, piece: str, finish: str | None = None, usage: str = "", timings: str = "") -> bytes:
        """One ``data:`` event, its keys in llama-server's order."""
        if self.chat:
            delta = "{}" if finish else '{"content":' + json.dumps(piece) + "}"
            choice = f'{{"finish_reason":{json.dumps(finish)},"index":0,"delta":{delta}}}'
            tail = f'"object":"chat.completion.chunk"{usage}{timings}'
            return f'data: {{"choices":[{choice}],{self.common},{tail}}}\n\n'.encode()
        choice = (
            f'{{"text":{json.dumps(piece)},"index":0,"logprobs":null,"finish_reason":{json.dumps(finish)}}}'
        )
        tail = f'"object":"text_completion"{usage},"id":"{self.ident}"{timings}'
        return f'data: {{"choices":[{choice}],{self.common_text},{tail}}}\n\n'.encode()

    def _pieces(self, size: float | None) -> list[str]:
        """The content pieces cycled through: words, or one text that makes each event ``size`` bytes."""
        if size is None:
            first = self.conn.replica.counter
            return [WORDS[(first + i) % len(WORDS)] for i in range(len(WORDS))]
        return ["x" * max(int(size) - len(self._event("")), 1)]

    def begin(self) -> None:
        replica = self.conn.replica
        if self.conn.closed:
            self.gone = True
            replica.release()
            return
        self.t0 = replica.loop.time() + self.ttft
        self.started = time.perf_counter()
        if self.streamed:
            self.conn.write(head("200 OK", "text/event-stream", None, self.close))
        self._schedule(self.t0)

    def _schedule(self, when: float) -> None:
        loop = self.conn.replica.loop
        if self.rate <= 0 or when <= loop.time():
            self.timer = loop.call_soon(self.step)
        else:
            self.timer = loop.call_at(when, self.step)

    def abandon(self) -> None:
        """The client went away: free the slot (llama-server notices it on its next write)."""
        if not self.gone:
            self.gone = True
            if self.timer is not None:
                self.timer.cancel()
            self.conn.replica.release()

    def step(self) -> None:
        conn = self.conn
        if self.gone or conn.closed:
            return
        if self.streamed and self.n > 0:
            if conn.paused:
                self.stalled = True
                return
            chunk = self.chunks[self.k % len(self.chunks)]
            if self.k == 0 and self.chat:  # llama-server sends the role with the first token, in one chunk
                role = f'data: {{"choices":[{{"finish_reason":null,"index":0,"delta":{ROLE}}}],{self.common},'
                first = self._event(self.pieces[0])
                chunk = http_chunk((role + '"object":"chat.completion.chunk"}\n\n').encode() + first)
            conn.write(chunk)
        self.k += 1
        if self.k >= self.n:
            self._end()
            return
        self._schedule(self.t0 + (self.k / self.rate if self.rate > 0 else 0.0))

    def _end(self) -> None:
        self.gone = True
        conn = self.conn
        predicted_ms = max((time.perf_counter() - self.started) * 1000.0, 0.001)
        n_out, n_prompt = self.n, self.n_prompt
        timings = {
            "cache_n": 0,
            "prompt_n": n_prompt,
            "prompt_ms": 0.5,
            "prompt_per_token_ms": 0.5 / n_prompt,
            "prompt_per_second": n_prompt * 2000.0,
            "predicted_n": n_out,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_out if n_out else 0.0,
            "predicted_per_second": n_out * 1000.0 / predicted_ms,
        }
        usage = {
            "completion_tokens": n_out,
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        conn.replica.release()
        if not self.streamed:
            conn.send_json(200, self._whole(usage, timings), self.close)
            return
        usage_part = ',"usage":' + json.dumps(usage, separators=(",", ":"))
        timings_part = ',"timings":' + json.dumps(timings, separators=(",", ":"))
        if not self.chat:
            final = self._event("", self.finish, usage_part, timings_part)
        elif self.usage_chunk:
            tail = f'"object":"chat.completion.chunk"{usage_part}{timings_part}'
            final = self._event("", self.finish) + f'data: {{"choices":[],{self.common},{tail}}}\n\n'.encode()
        else:
            final = self._event("", self.finish, "", timings_part)
        conn.write(http_chunk(final))
        conn.write(http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        conn.finished(self.close)

    def _whole(self, usage: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
        """The reply of a request that does not stream."""
        text = "".join(self.pieces[i % len(self.pieces)] for i in range(self.n))
        model = self.conn.replica.model_id
        common = {"created": self.created, "model": model, "system_fingerprint": BUILD_INFO}
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"finish_reason": self.finish, "index": 0, "message": message}
            kind = "chat.completion"
        else:
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": self.finish}
            kind = "text_completion"
        return {
            "choices": [choice],
            **common,
            "object": kind,
            "usage": usage,
            "id": self.ident,
            "timings": timings,
        }
