"""Configuration values: defaults, GPU spellings, pricing, pass-through flags, names, and environment
overrides."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs
import pytest

from router.config.load import (
    ALL_GPUS,
    ConfigError,
    ModelConfig,
    Pricing,
    ReasoningEffort,
    RouterSettings,
    check_gpu_ids,
    load_config,
    resolve_gpus,
    resolve_name,
)
from router.config.schema import ROUTER_KEYS
from tests.unit.config_builders import FILE, build, error_of, setter


def test_values_and_defaults() -> None:
    config = build(env={"HOME": "/home/u"})
    qwen = config.models["qwen"]
    assert qwen == ModelConfig(
        name="qwen", path=Path("/models/qwen.gguf"), parallel=4, aliases=("qwen-latest",)
    )
    assert qwen.gpus == (0,) and qwen.ctx is None and qwen.gpu_layers is None and qwen.ttl is None
    digest = hashlib.sha256(FILE.encode()).hexdigest()[:8]
    assert config.router == RouterSettings(
        num_gpus=2,
        history_db=Path(f"/home/u/.local/state/llama-router/llama-router-{digest}/history.db"),
        replica_logs=Path("/home/u/.local/state/llama-router/logs"),
        kv_store_dir=Path("/home/u/.local/state/llama-router/kv"),
    )
    assert config.pools["chat"].members == ("qwen", "small")
    assert config.defaults == {}


def test_router_defaults_equal_the_schema() -> None:
    settings = RouterSettings()
    for spec in ROUTER_KEYS:
        if spec.name in ("history_db", "replica_logs", "kv_store_dir"):  # computed from the environment
            continue
        assert getattr(settings, spec.name) == spec.default, spec.name


@pytest.mark.parametrize(
    ("value", "expected"),
    [("all", ALL_GPUS), (-1, ALL_GPUS), (1, (1,)), ([1, 0], (0, 1)), ([0], (0,)), ([], ())],
)
def test_gpu_spellings(value: Any, expected: Any) -> None:
    assert build(setter("models.qwen.gpus", value)).models["qwen"].gpus == expected


def test_num_gpus_zero_puts_every_model_on_the_cpu() -> None:
    config = build(setter("router.num_gpus", 0))
    assert {m.gpus for m in config.models.values()} == {()}

    def one_gpu(data: dict[str, Any]) -> None:
        setter("router.num_gpus", 1)(data)
        setter("models.qwen.gpus", 1)(data)

    message = str(error_of(one_gpu))
    assert "models.qwen.gpus = 1 is invalid" in message and "< router.num_gpus = 1" in message

    def every_gpu(data: dict[str, Any]) -> None:
        data["router"]["num_gpus"] = 0
        for model in data["models"].values():
            model["gpus"] = "all"

    config = build(every_gpu)
    assert resolve_gpus(config.models["qwen"], []) == ()


def test_resolve_gpus_and_check_gpu_ids() -> None:
    def change(data: dict[str, Any]) -> None:
        data["router"] = {}
        data["models"]["qwen"]["gpus"] = "all"
        data["models"]["small"]["gpus"] = [3]

    config = build(change)
    assert resolve_gpus(config.models["qwen"], [2, 0, 1]) == (0, 1, 2)
    assert resolve_gpus(config.models["small"], [0, 1]) == (3,)
    check_gpu_ids(config, [0, 1, 2, 3])
    with pytest.raises(ConfigError) as info:
        check_gpu_ids(config, [0, 1])
    assert str(info.value) == (
        f"config error in {FILE}: models.small.gpus = [3] is invalid: GPU 3 does not exist; "
        "GPUs present: 0, 1"
    )


def test_pricing_and_reasoning_effort() -> None:
    def change(data: dict[str, Any]) -> None:
        data["models"]["qwen"]["pricing"] = {"input": 0.4, "output": 2}
        data["models"]["qwen"]["reasoning_effort"] = {"options": ["low", "high"], "default": "high"}

    qwen = build(change).models["qwen"]
    assert qwen.pricing == Pricing(input=0.4, cached_input=None, output=2.0)
    assert qwen.reasoning_effort == ReasoningEffort(options=("low", "high"), default="high")


def test_pass_through_flags_keep_file_order_and_types() -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {"flash-attn": "on", "metrics": True}
        data["models"]["qwen"].update(
            {"ctk": "q8_0", "mlock": False, "override-kv": ["a=int:1", "b=int:2"], "t": 4}
        )

    config = build(change)
    assert list(config.defaults.items()) == [("flash-attn", "on"), ("metrics", True)]
    assert config.models["qwen"].extra_args == (
        ("ctk", "q8_0"),
        ("mlock", False),
        ("override-kv", ("a=int:1", "b=int:2")),
        ("t", 4),
    )


def test_default_pool_accepts_a_pool_alias() -> None:
    assert build(setter("router.default_pool", "auto-chat")).router.default_pool == "chat"
    assert build(setter("router.default_pool", "chat")).router.default_pool == "chat"
    message = str(error_of(setter("router.default_pool", "qwen")))
    assert 'router.default_pool = "qwen" is invalid: must name a pool or pool alias' in message


def test_resolve_name() -> None:
    config = build()
    assert resolve_name(config, "qwen") == "qwen"
    assert resolve_name(config, "qwen-latest") == "qwen"
    assert resolve_name(config, "chat") == "chat"
    assert resolve_name(config, "auto-chat") == "chat"
    assert resolve_name(config, "QWEN") is None
    assert resolve_name(config, "") is None


def test_config_is_frozen_and_hashable() -> None:
    config = build()
    assert hash(config) == hash(build())
    assert config == build()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.router.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.models["x"] = config.models["qwen"]  # type: ignore[index]


def test_json_null_counts_as_absent() -> None:
    def change(data: dict[str, Any]) -> None:
        data["router"]["port"] = None
        data["models"]["qwen"]["ctx"] = None
        data["models"]["qwen"]["mlock"] = None

    config = build(change)
    assert config.router.port == 8080
    assert config.models["qwen"].ctx is None
    assert config.models["qwen"].extra_args == ()


# -------------------------------------------------------------------------------------------- environment


def test_environment_overrides() -> None:
    env = {
        "ROUTER_HOST": "0.0.0.0",
        "ROUTER_PORT": "9001",
        "ROUTER_API_KEYS": " k1, k2 ,,k1",
        "HISTORY_DB_PATH": "/tmp/h.db",
    }
    config = build(setter("router.api_keys", ["file-key"]), env=env)
    assert config.router.host == "0.0.0.0"
    assert config.router.port == 9001
    assert config.router.api_keys == ("k1", "k2")
    assert config.router.history_db == Path("/tmp/h.db")


def test_empty_environment_variables_count_as_unset() -> None:
    env = {"ROUTER_HOST": "", "ROUTER_PORT": " ", "ROUTER_API_KEYS": " , ", "HISTORY_DB_PATH": ""}
    config = build(setter("router.api_keys", ["file-key"]), env=env | {"XDG_STATE_HOME": "/state"})
    assert config.router.host == "127.0.0.1"
    assert config.router.port == 8080
    assert config.router.api_keys == ("file-key",)
    assert config.router.history_db.parent.parent == Path("/state/llama-router")


@pytest.mark.parametrize(("value", "rule"), [("abc", "an integer between 0"), ("99999", "and 65535")])
def test_bad_environment_values_name_the_variable(value: str, rule: str) -> None:
    message = str(error_of(lambda data: None, env={"ROUTER_PORT": value}))
    assert message.startswith(
        f'config error in {FILE}: ROUTER_PORT = "{value}" (environment, overrides router.port) is invalid: '
        "must be "
    )
    assert rule in message


def test_load_config_reads_os_environ_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[models.a]\nmodel = "a.gguf"\n')
    monkeypatch.setenv("ROUTER_PORT", "7777")
    monkeypatch.setenv("HISTORY_DB_PATH", "rel/h.db")
    config = load_config(path)
    assert config.router.port == 7777
    assert config.router.history_db == Path("rel/h.db")  # relative to the working directory, not the file
    assert load_config(path, env={}).router.port == 8080
