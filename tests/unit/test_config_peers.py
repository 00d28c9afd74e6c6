"""``[peers.NAME]``: validation, pool members served by peers, discovery documents, the scheduler's view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.load import config_from_dict
from router.config.values import ConfigError
from router.deploy.peer_settings import PeerModels, with_peers
from router.shell.peers import read_models
from statemachine import ModelSpec, PoolSpec, Settings


def _doc(peers: dict[str, Any], pools: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"models": {"near": {"model": "/m/near.gguf"}}, "peers": peers}
    if pools:
        doc["pools"] = pools
    return doc


def _error(doc: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(doc, "c.toml")
    return str(info.value)


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://192.168.1.30:8080", "http://192.168.1.30:8080"),
        ("http://192.168.1.30:8080/v1/", "http://192.168.1.30:8080"),
        ("https://llm.example.org/gpu/", "https://llm.example.org/gpu"),
        ("http://[fd00::7]:8080", "http://[fd00::7]:8080"),
    ],
)
def test_the_url_is_kept_without_a_trailing_v1(url: str, canonical: str) -> None:
    config = config_from_dict(_doc({"attic": {"url": url}}))
    assert config.peers["attic"].url == canonical


@pytest.mark.parametrize(
    "url", ["ftp://h:1", "192.168.1.30:8080", "http://", "http://h:8080/?a=1", "http://u:p@h"]
)
def test_a_bad_url_is_refused_with_the_rule(url: str) -> None:
    message = _error(_doc({"attic": {"url": url}}))
    assert f"peers.attic.url = {url!r}".replace("'", '"') in message
    assert "must be an http:// or https:// URL" in message


def test_missing_url_and_unknown_keys_are_refused() -> None:
    assert "peers.attic.url is missing" in _error(_doc({"attic": {}}))
    assert "peers.attic.adress" in _error(_doc({"attic": {"url": "http://h:1", "adress": "x"}}))


def test_a_key_comes_from_the_config_or_a_file_not_both(tmp_path: Path) -> None:
    key = tmp_path / "attic.key"
    key.write_text("\n  secret-1  \n")
    config = config_from_dict(_doc({"attic": {"url": "http://h:1", "api_key_file": str(key)}}))
    assert config.peers["attic"].api_key == "secret-1"
    both = _error(_doc({"attic": {"url": "http://h:1", "api_key": "x", "api_key_file": str(key)}}))
    assert "set either api_key or api_key_file, not both" in both
    absent = _error(_doc({"attic": {"url": "http://h:1", "api_key_file": str(tmp_path / "none")}}))
    assert "peers.attic.api_key_file" in absent and "cannot be read" in absent


def test_a_listed_model_may_not_take_a_local_name() -> None:
    message = _error(_doc({"attic": {"url": "http://h:1", "models": ["near"]}}))
    assert "'near' is also models.near here" in message


def test_pool_members_may_be_a_peers_models() -> None:
    listed = _doc({"attic": {"url": "http://h:1", "models": ["far"]}}, {"p": {"members": ["near", "far"]}})
    assert config_from_dict(listed).pools["p"].members == ("near", "far")
    unknown = _doc({"attic": {"url": "http://h:1", "models": ["far"]}}, {"p": {"members": ["near", "other"]}})
    message = _error(unknown)
    assert "'other' is not a model" in message and "models of peers: far" in message
    # A peer that discovers its models may serve any name: resolved once it has answered.
    discovering = _doc(
        {"attic": {"url": "http://h:1"}}, {"p": {"members": ["near", "later"], "fallback": True}}
    )
    assert config_from_dict(discovering).pools["p"].members == ("near", "later")


def test_discovery_keeps_the_peers_own_models_with_their_capacity() -> None:
    document = {
        "object": "list",
        "data": [
            {"id": "qwen", "aliases": ["q"], "slots": 2, "ctx_per_slot": 4096, "parallel": 2},
            {"id": "small", "slots": 1},
            {"id": "auto", "pool": ["qwen", "small"], "slots": 9},  # a pool: its capacity is its members'
            {"id": "elsewhere", "peer": "box"},  # served by a peer of that peer: not its own
            {"object": "model"},  # no id
        ],
    }
    found = read_models(document)
    assert found.names == ("qwen", "small", "auto")
    assert found.aliases["qwen"] == ("q",) and found.ctx_per_slot == {"qwen": 4096}
    assert found.capacity == 3
    assert read_models({"data": [{"id": "gpt"}]}).capacity is None  # a plain OpenAI server says nothing
    with pytest.raises(ValueError, match="not a model list"):
        read_models({"models": []})


def test_the_scheduler_sees_peer_models_limits_and_pools_over_known_members() -> None:
    config = config_from_dict(
        {
            "models": {"near": {"model": "/m/near.gguf"}},
            "peers": {
                "attic": {"url": "http://h:1"},
                "shed": {"url": "http://h:2", "models": ["far", "tiny"], "max_in_flight": 7},
            },
            "pools": {"p": {"members": ["near", "far", "later"], "fallback": True}},
        }
    )
    local = Settings(models=[ModelSpec("near")], pools=[PoolSpec("p", ("near",), True)])
    before = with_peers(config, local, {})
    assert set(before.models) == {"near", "far", "tiny"}
    assert before.pools["p"].members == ("near", "far")  # "later" is not known yet
    assert before.peer_limit("attic") == 4 and before.peer_limit("shed") == 7
    found = {"attic": PeerModels(("later", "near", "far"), capacity=3)}
    after = with_peers(config, local, found)
    assert after.pools["p"].members == ("near", "far", "later")
    assert after.models["later"].peer == "attic"
    assert after.models["near"].peer is None  # a local name stays local
    assert after.models["far"].peer == "shed"  # listed there: a discovery does not take it away
    assert after.peer_limit("attic") == 3
