"""What a model or pool can do (``router.observe.capabilities``), read from its llama-server flags."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.load import config_from_dict
from router.observe.capabilities import capabilities

FILE = "/etc/llama-router.toml"


def config_of(models: dict[str, dict[str, Any]], **doc: Any) -> Any:
    tables = {name: {"model": f"/models/{name}.gguf", **table} for name, table in models.items()}
    return config_from_dict({"models": tables, **doc}, FILE)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({}, ["chat", "completion", "tools"]),
        ({"no-jinja": True}, ["chat", "completion"]),
        ({"jinja": False}, ["chat", "completion", "tools"]),  # false is not passed: the default stays on
        ({"embedding": True}, ["embedding"]),
        ({"--embeddings": True}, ["embedding"]),
        ({"embedding": True, "pooling": "rank"}, ["rerank"]),
        ({"reranking": True}, ["rerank"]),
        ({"rerank": True}, ["rerank"]),
        ({"embedding": False}, ["chat", "completion", "tools"]),
        ({"mmproj": "/models/proj.gguf"}, ["chat", "completion", "vision", "tools"]),
        ({"mm": "/models/proj.gguf"}, ["chat", "completion", "vision", "tools"]),
        ({"mmproj-url": "https://example.org/p.gguf"}, ["chat", "completion", "vision", "tools"]),
        ({"mmproj": "/models/proj.gguf", "no-mmproj": True}, ["chat", "completion", "tools"]),
    ],
)
def test_a_models_flags_say_what_it_can_do(table: dict[str, Any], expected: list[str]) -> None:
    assert capabilities(config_of({"m": table}), "m") == expected


def test_defaults_count_and_a_model_may_switch_them_off() -> None:
    config = config_of({"plain": {}, "chatty": {"embedding": False}}, defaults={"embedding": True})
    assert capabilities(config, "plain") == ["embedding"]
    assert capabilities(config, "chatty") == ["chat", "completion", "tools"]


def test_a_pool_can_do_what_any_member_can_and_unknown_names_nothing() -> None:
    models = {"embed": {"embedding": True}, "see": {"mmproj": "/models/p.gguf", "no-jinja": True}}
    config = config_of(models, pools={"both": {"members": ["embed", "see"]}})
    assert capabilities(config, "both") == ["chat", "completion", "embedding", "vision"]
    assert capabilities(config, "nobody") == []
