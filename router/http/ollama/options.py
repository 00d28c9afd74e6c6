"""Ollama's ``options``, ``format`` and ``think`` fields as llama-server's request fields.

Sampling options become the field of the same meaning; options that shape a load (``num_ctx``,
``num_gpu``, ``num_thread``, ...) belong to the router's configuration here and are accepted and left out,
since one replica serves every client of its model; an option Ollama does not define is refused, naming
the ones accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from router.http.errors import HttpCode
from router.http.request_body import BodyError

# Ollama option -> llama-server field.
SAMPLING: Mapping[str, str] = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
}
# Options that choose how a model loads: set in the router's config (``ctx``, ``gpus``, ``threads``, ...).
LOAD_OPTIONS = frozenset(
    {
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "numa",
        "num_thread",
        "use_mmap",
        "use_mlock",
        "vocab_only",
        "logits_all",
        "embedding_only",
        "f16_kv",
    }
)
# Options llama-server no longer has: accepted and left out.
RETIRED = frozenset({"tfs_z", "penalize_newline"})
KNOWN = frozenset({*SAMPLING, "num_predict", *LOAD_OPTIONS, *RETIRED})


def _invalid(message: str) -> BodyError:
    return BodyError(message, HttpCode.INVALID_REQUEST)


def sampling_fields(options: Any) -> dict[str, Any]:
    """llama-server's fields for an Ollama ``options`` object (None or absent: none)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise _invalid('\'options\' must be an object such as {"temperature": 0.2, "num_predict": 64}')
    unknown = sorted(name for name in options if name not in KNOWN)
    if unknown:
        accepted = ", ".join(sorted(KNOWN))
        raise _invalid(f"unknown option(s) {', '.join(map(repr, unknown))}; the options accepted: {accepted}")
    out: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in SAMPLING:
            out[SAMPLING[name]] = value
        elif name == "num_predict":
            out.update(_num_predict(value))
    return out


def _num_predict(value: Any) -> dict[str, Any]:
    """``num_predict``: a token limit; -1 (no limit) and -2 (until the context is full) set none."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _invalid(f"'num_predict' = {value!r} is not a number of tokens (-1: no limit)")
    if value < 0:
        return {}
    return {"max_tokens": int(value)}


def response_format(value: Any) -> dict[str, Any]:
    """llama-server's ``response_format`` for Ollama's ``format``: "json", a JSON schema, or nothing."""
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": value}}
        }
    raise _invalid(f"'format' = {value!r} is neither \"json\" nor a JSON schema object")


def thinking(value: Any) -> dict[str, Any]:
    """llama-server's fields for Ollama's ``think``: on or off, or an effort ("low", "medium", "high")."""
    if value is None:
        return {}
    if isinstance(value, bool):
        fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": value}}
        if value:
            fields["reasoning_format"] = "deepseek"
        return fields
    if value in ("low", "medium", "high"):
        return {
            "chat_template_kwargs": {"enable_thinking": True},
            "reasoning_format": "deepseek",
            "reasoning_effort": value,
        }
    raise _invalid(f'\'think\' = {value!r} is not true, false, "low", "medium" or "high"')
