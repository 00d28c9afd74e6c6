"""Reading a peer's /v1/models (``router.shell.peers``): alias entries add names, never models or capacity;
capabilities are kept per model."""

from __future__ import annotations

from router.shell.peers import read_capabilities, read_models

DOCUMENT = {
    "object": "list",
    "data": [
        {"id": "big", "slots": 4, "ctx_per_slot": 8192, "capabilities": ["chat", "tools"]},
        # An alias entry repeats its model's description; whatever it carries counts for nothing.
        {"id": "large", "alias_of": "big", "slots": 4, "ctx_per_slot": 1, "capabilities": ["rerank"]},
        {"id": "emb", "slots": 1, "aliases": ["e"], "capabilities": ["embedding"]},
        {"id": "e", "alias_of": "emb"},
        {"id": "orphan", "alias_of": "not-listed"},
        {"id": "relayed", "peer": "other", "slots": 9},
        {"id": "relayed-alias", "alias_of": "relayed", "peer": "other"},
    ],
}


def test_alias_entries_add_names_to_their_models_and_nothing_else() -> None:
    found = read_models(DOCUMENT)
    assert found.names == ("big", "emb")
    assert found.capacity == 5
    assert dict(found.aliases) == {"big": ("large",), "emb": ("e",)}
    assert dict(found.ctx_per_slot) == {"big": 8192}


def test_capabilities_come_from_model_entries_only() -> None:
    assert read_capabilities(DOCUMENT) == {"big": ("chat", "tools"), "emb": ("embedding",)}
    assert read_capabilities({"data": [{"id": "plain"}]}) == {}  # a plain OpenAI server says nothing
    assert read_capabilities(["not", "a", "document"]) == {}
