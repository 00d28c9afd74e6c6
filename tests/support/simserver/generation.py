"""A request turned into work: the error a request can end in, the generation job it asks for, the state
of a generation as it runs, and the request-parsing helpers the endpoints share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.support.simserver.tokens import render_chat, text_of, tokenize


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


def int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RequestError(400, f"invalid integer value: {value!r}") from None


def stop_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str) and s)
    raise RequestError(400, "'stop' must be a string or a list of strings")


def prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list):
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if prompt and isinstance(prompt[0], str | list):
            return prompt_ids(prompt[0])
    if prompt is None:
        raise RequestError(400, "'prompt' is required")
    raise RequestError(400, "'prompt' must be a string or a list of tokens")


def anthropic_prompt(body: dict[str, Any]) -> str:
    """The prompt text of an Anthropic Messages body (its ``system`` first)."""
    messages = body.get("messages")
    if messages is None:
        raise RequestError(500, "'messages' is required", "server_error")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' is required and must be a non-empty list")
    system = body.get("system")
    full = ([{"role": "system", "content": text_of(system)}] if system else []) + messages
    return render_chat(full)
