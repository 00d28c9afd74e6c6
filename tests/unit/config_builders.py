"""Building configurations for the configuration tests: a small valid document, changes to it, and the
error a change causes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from router.config.load import Config, ConfigError, config_from_dict

FILE = "/etc/llama-router.toml"


def base() -> dict[str, Any]:
    return {
        "router": {"num_gpus": 2},
        "models": {
            "qwen": {"model": "/models/qwen.gguf", "parallel": 4, "aliases": ["qwen-latest"]},
            "small": {"model": "/models/small.gguf"},
        },
        "pools": {"chat": {"members": ["qwen", "small"], "aliases": ["auto-chat"]}},
    }


def build(change: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any) -> Config:
    data = base()
    if change is not None:
        change(data)
    return config_from_dict(data, FILE, **kwargs)


def error_of(change: Callable[[dict[str, Any]], None], **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build(change, **kwargs)
    return info.value


def setter(dotted: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        table = data
        for part in parents:
            table = table.setdefault(part, {})
        table[last] = value

    return change


def deleter(dotted: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        table = data
        for part in parents:
            table = table[part]
        del table[last]

    return change
