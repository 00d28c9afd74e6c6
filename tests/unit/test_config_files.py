"""Configuration files: the example, TOML and JSON alike, relative paths, unreadable files, API key files."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import attrs
import pytest

from router.config.key_specs import KEY_KEYS
from router.config.load import ConfigError, config_from_dict, load_config, read_api_keys
from router.config.model_keys import MODEL_KEYS
from router.config.schema import DEVICE_KEYS, PEER_KEYS, POOL_KEYS, ROUTER_KEYS, RPC_DEVICE_KEYS
from tests.unit.config_builders import base

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "full.toml"


def test_the_example_loads_and_sets_every_key() -> None:
    config = load_config(EXAMPLE, env={})
    assert config.router.default_pool == "chat"
    assert config.models["qwen"].gpus == (0, 1)
    assert config.models["small"].path == EXAMPLE.parent / "small.gguf"
    data = tomllib.loads(EXAMPLE.read_text())
    # queue_head_grace replaces the swap batching keys, so the example names it in a comment only
    assert set(data["router"]) | {"queue_head_grace"} == {spec.name for spec in ROUTER_KEYS}
    assert "# queue_head_grace = " in EXAMPLE.read_text()
    assert set(data["devices"]["0"]) == {spec.name for spec in DEVICE_KEYS}
    assert set(data["rpc_devices"]["box"]) == {spec.name for spec in RPC_DEVICE_KEYS}
    # gpus_max and spread only go with gpus = "any", which rpc devices do not: coder shows them
    assert {spec.name for spec in MODEL_KEYS} <= set(data["models"]["qwen"]) | set(data["models"]["coder"])
    assert config.models["coder"].gpus == "any" and config.models["coder"].gpus_max == 2
    assert set(data["pools"]["chat"]) == {spec.name for spec in POOL_KEYS}
    assert set(data["peers"]["attic"]) | {"api_key_file"} == {spec.name for spec in PEER_KEYS}
    assert config.peers["attic"].models == ("big",)
    assert set(data["keys"]["alice"]) | {"key_env", "key_file"} == {spec.name for spec in KEY_KEYS}
    assert config.keys["alice"].klass == "interactive" and config.keys["alice"].weight == 2


def test_json_is_equivalent_to_toml(tmp_path: Path) -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    (tmp_path / "c.toml").write_text(EXAMPLE.read_text())
    (tmp_path / "c.json").write_text(json.dumps(data))
    from_toml = load_config(tmp_path / "c.toml", env={})
    from_json = load_config(tmp_path / "c.json", env={})
    assert from_json.path == tmp_path / "c.json"
    assert attrs.evolve(from_json, path=from_toml.path) == from_toml
    assert from_json.models["small"].path == tmp_path / "small.gguf"


def test_json_errors_name_the_json_file(tmp_path: Path) -> None:
    data = copy.deepcopy(base())
    data["models"]["qwen"]["parallel"] = 0
    path = tmp_path / "c.JSON"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert (
        str(info.value)
        == f"config error in {path}: models.qwen.parallel = 0 is invalid: must be an integer >= 1"
    )


def test_relative_paths_start_at_the_config_directory(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "router.toml"
    path.parent.mkdir()
    path.write_text(
        '[router]\napi_keys_file = "keys.txt"\nllama_server = "bin/llama-server"\n'
        '[models.a]\nmodel = "../models/a.gguf"\n[models.b]\nmodel = "/abs/b.gguf"\n'
    )
    config = load_config(path, env={})
    assert config.models["a"].path == tmp_path / "conf" / "../models/a.gguf"
    assert config.models["b"].path == Path("/abs/b.gguf")
    assert config.router.api_keys_file == tmp_path / "conf" / "keys.txt"
    assert config.router.llama_server == str(tmp_path / "conf" / "bin" / "llama-server")
    bare = config_from_dict({"router": {"llama_server": "llama-server"}, "models": {"a": {"model": "a"}}})
    assert bare.router.llama_server == "llama-server"
    assert bare.models["a"].path == Path("a")


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("bad.toml", "[router\n", "not valid TOML: "),
        ("bad.json", "{", "not valid JSON: "),
        ("bad.toml", "\xff", "not valid TOML: "),
    ],
)
def test_unparsable_files(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"config error in {path}: {fragment}")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"config error in {path}: cannot read the file: No such file or directory"


def test_read_api_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk-file-1\n\n  k-file-2  \nk-1\n")
    path = tmp_path / "c.toml"
    path.write_text('[router]\napi_keys = ["k-1"]\napi_keys_file = "keys"\n[models.a]\nmodel = "a.gguf"\n')
    assert read_api_keys(load_config(path, env={})) == ("k-1", "k-file-1", "k-file-2")
    assert read_api_keys(load_config(path, env={"ROUTER_API_KEYS": "k-env"})) == (
        "k-env",
        "k-file-1",
        "k-file-2",
        "k-1",
    )
    keys.unlink()
    with pytest.raises(ConfigError) as info:
        read_api_keys(load_config(path, env={}))
    assert str(info.value).startswith(f'config error in {path}: router.api_keys_file = "{keys}" is invalid: ')
    assert info.value.key == "router.api_keys_file"
