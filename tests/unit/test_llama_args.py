"""llama-server command lines, GPU masking environment and effective cache types."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from router.config.llama_args import (
    cache_types,
    flag_identity,
    gpu_env,
    llama_server_argv,
    merged_flags,
    render_flag,
    render_flags,
)
from router.config.load import ConfigError, ModelConfig, config_from_dict

ROUTER_FLAGS = ["--fit", "off"]


def model(**flags: Any) -> ModelConfig:
    return ModelConfig(
        name="qwen", path=Path("/models/qwen.gguf"), parallel=4, extra_args=tuple(flags.items())
    )


def test_router_flags_come_first_in_a_fixed_order() -> None:
    argv = llama_server_argv("/bin/llama-server", model(), {}, port=41234, ctx=16384, gpu_layers=99)
    assert argv == [
        "/bin/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "-m",
        "/models/qwen.gguf",
        "-c",
        "16384",
        "-np",
        "4",
        "-ngl",
        "99",
        "--fit",
        "off",
    ]


def test_host_can_be_chosen() -> None:
    argv = llama_server_argv("llama-server", model(), {}, port=1, ctx=512, gpu_layers=0, host="127.0.0.2")
    assert argv[1:3] == ["--host", "127.0.0.2"]


def test_pass_through_flags_are_rendered_after_the_router_flags() -> None:
    defaults = {"flash-attn": "on", "metrics": True, "mlock": True, "t": 4}
    own = model(
        **{
            "ctk": "q8_0",
            "mlock": False,
            "override-kv": ("a=int:1", "b=str:x"),
            "rope-freq-scale": 0.5,
            "--no-warmup": True,
            "-sm": "row",
        }
    )
    argv = llama_server_argv("llama-server", own, defaults, port=5000, ctx=8192, gpu_layers=12)
    tail = argv[argv.index("off") + 1 :]
    assert tail == [
        "--flash-attn",
        "on",
        "--metrics",
        "-t",
        "4",
        "-ctk",
        "q8_0",
        "--override-kv",
        "a=int:1",
        "--override-kv",
        "b=str:x",
        "--rope-freq-scale",
        "0.5",
        "--no-warmup",
        "-sm",
        "row",
    ]


def test_model_flags_replace_defaults_whatever_the_spelling() -> None:
    defaults = {"cache-type-k": "q4_0", "fa": "on", "threads": 8}
    own = model(**{"-ctk": "q8_0", "flash-attn": "off"})
    words = render_flags(merged_flags(defaults, own.extra_args))
    assert words == ["-ctk", "q8_0", "--flash-attn", "off", "--threads", "8"]


def test_false_in_the_model_removes_a_default_flag() -> None:
    argv = llama_server_argv("x", model(metrics=False), {"metrics": True}, port=1, ctx=1, gpu_layers=1)
    assert "--metrics" not in argv


def test_empty_list_renders_nothing() -> None:
    assert render_flags([("lora", ())]) == []


@pytest.mark.parametrize(
    ("key", "flag", "identity"),
    [
        ("flash-attn", "--flash-attn", "flash-attn"),
        ("fa", "-fa", "flash-attn"),
        ("-fa", "-fa", "flash-attn"),
        ("ctk", "-ctk", "cache-type-k"),
        ("--cache-type-v", "--cache-type-v", "cache-type-v"),
        ("t", "-t", "threads"),
        ("v", "-v", "v"),
        ("n-gpu-layers", "--n-gpu-layers", "gpu-layers"),
        ("jinja", "--jinja", "jinja"),
    ],
)
def test_flag_spellings(key: str, flag: str, identity: str) -> None:
    assert render_flag(key) == flag
    assert flag_identity(key) == identity


@pytest.mark.parametrize("key", ["port", "--host", "m", "c", "np", "ngl", "fit", "api-key"])
def test_router_owned_flags_are_refused_even_without_validation(key: str) -> None:
    with pytest.raises(ValueError, match="is set by the router"):
        llama_server_argv("x", model(), {key: "1"}, port=1, ctx=1, gpu_layers=1)
    with pytest.raises(ValueError, match="is set by the router"):
        llama_server_argv("x", model(**{key: "1"}), {}, port=1, ctx=1, gpu_layers=1)


def test_argv_from_a_loaded_config() -> None:
    config = config_from_dict(
        {
            "defaults": {"flash-attn": "on", "cache-type-k": "q8_0"},
            "models": {"a": {"model": "/m/a.gguf", "parallel": 2, "ctk": "q4_0", "ctv": "q4_0"}},
        }
    )
    argv = llama_server_argv(
        "llama-server", config.models["a"], config.defaults, port=9, ctx=4096, gpu_layers=3
    )
    assert argv[argv.index("off") + 1 :] == ["--flash-attn", "on", "-ctk", "q4_0", "-ctv", "q4_0"]
    assert cache_types(config.models["a"], config.defaults) == ("q4_0", "q4_0")


def test_gpu_env() -> None:
    order = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA ordinals in NVML's (PCI bus) order
    assert gpu_env([0, 2]) == {**order, "CUDA_VISIBLE_DEVICES": "0,2", "HIP_VISIBLE_DEVICES": "0,2"}
    assert gpu_env((1,)) == {**order, "CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}
    assert gpu_env([]) == {**order, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("key", ["device", "dev", "-dev", "main-gpu", "mg", "--main-gpu"])
def test_device_selection_flags_are_refused_because_of_masking(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(
            {"models": {"a": {"model": "/m/a.gguf", "gpus": [2, 3], key: "1"}}}, "/etc/router.toml"
        )
    message = str(info.value)
    assert "renumbered from 0" in message and "gpus" in message


@pytest.mark.parametrize(
    ("defaults", "own", "expected"),
    [
        ({}, {}, ("f16", "f16")),
        ({"ctk": "q8_0"}, {}, ("q8_0", "f16")),
        ({"cache-type-k": "q8_0", "-ctv": "q8_0"}, {"ctv": "q4_0"}, ("q8_0", "q4_0")),
        ({}, {"--cache-type-k": "bf16", "cache-type-v": "q5_1"}, ("bf16", "q5_1")),
        ({"ctk": "q8_0"}, {"ctk": False}, ("f16", "f16")),
    ],
)
def test_cache_types(defaults: dict[str, Any], own: dict[str, Any], expected: tuple[str, str]) -> None:
    assert cache_types(model(**own), defaults) == expected


@pytest.mark.real
def test_real_llama_server_accepts_the_argv(tmp_path: Path) -> None:
    """The real binary parses our argv (it then fails only because the model file does not exist)."""
    from router.hosts.locate import LlamaServerNotFound, find_llama_server

    try:
        binary = str(find_llama_server(None))
    except LlamaServerNotFound:
        pytest.skip("no llama-server binary")

    def run(extra: dict[str, Any]) -> str:
        own = ModelConfig(
            name="m", path=tmp_path / "absent.gguf", parallel=2, extra_args=tuple(extra.items())
        )
        defaults = {"flash-attn": "auto", "ctk": "q8_0", "cache-type-v": "q8_0", "metrics": True}
        argv = llama_server_argv(binary, own, defaults, port=1, ctx=512, gpu_layers=0)
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env={**os.environ, **gpu_env([])}
        )
        assert done.returncode != 0
        return done.stdout + done.stderr

    output = run({"threads": 1, "no-warmup": True})
    assert "invalid argument" not in output
    assert "error while handling argument" not in output
    assert "absent.gguf" in output
    assert "invalid argument" in run({"no-such-flag": True})
