"""How each endpoint dresses a generation: OpenAI chat completions and completions, llama.cpp's own
/completion and /infill, Anthropic Messages and OpenAI Responses, streamed as server-sent events or whole.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.simserver.generation import Generation

BUILD_INFO = "b0-sim"


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
