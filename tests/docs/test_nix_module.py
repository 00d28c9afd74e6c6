"""The NixOS module evaluated without nixpkgs (tests/docs/module_stub.nix stands in for lib and pkgs), and
nix/settings.nix on its own: option names, the config document they render, and that the router loads it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from router.config.load import config_from_dict
from tests.support.nix_module import LLAMA_SERVER, ROOT, evaluate_module, nix_eval

STATE = {
    "history_db": "/var/lib/llama-router/history.db",
    "replica_logs": "/var/lib/llama-router/logs",
    "kv_store_dir": "/var/lib/llama-router/kv",
}


def render_settings(tmp_path: Path, cfg: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    expr = f'import {ROOT / "nix" / "settings.nix"} {{ cfg = VALUES; llamaServer = "/bin/llama-server"; }}'
    return nix_eval(tmp_path, expr, cfg)


def settings_of(tmp_path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    result = render_settings(tmp_path, cfg)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_the_module_offers_the_original_option_names_and_keeps_its_own(tmp_path: Path) -> None:
    doc = evaluate_module(tmp_path, {"enable": True})
    own = {"enable", "package", "llamaCpp", "host", "port", "openFirewall", "settings", "models"}
    original = {"maxModelsPerGpu", "evictionPolicy", "queueForceLoadTimeout", "gpuCount"}
    original |= {"promptCache", "presetGlobals"}
    assert own | original <= set(doc["options"])
    assert doc["promptCache"] == ["ramMiB", "ramMiBPerModel", "reuseChunk"]
    assert {"c", "cost", "reasoning_effort"} <= set(doc["modelOptions"])
    assert doc["enabled"] is True and doc["firewall"] == {"_if": False, "content": [8080]}


def test_the_existing_options_render_the_config_they_always_did(tmp_path: Path) -> None:
    values = {
        "enable": True,
        "host": "0.0.0.0",
        "port": 9000,
        "openFirewall": True,
        "settings": {"router": {"eviction": "fifo", "port": 1}, "defaults": {"flash-attn": "on"}},
        "models": {"qwen": {"model": "/srv/qwen.gguf", "gpus": [0, 1], "parallel": 4}},
    }
    doc = evaluate_module(tmp_path, values)
    assert doc["config"] == {
        "router": {
            "eviction": "fifo",
            "host": "0.0.0.0",
            "port": 9000,
            "llama_server": LLAMA_SERVER,
            **STATE,
        },
        "defaults": {"flash-attn": "on"},
        "models": {"qwen": {"model": "/srv/qwen.gguf", "gpus": [0, 1], "parallel": 4}},
    }
    assert doc["firewall"] == {"_if": True, "content": [9000]}


ORIGINAL_STYLE: dict[str, Any] = {
    "enable": True,
    "maxModelsPerGpu": 1,
    "evictionPolicy": "lru",
    "queueForceLoadTimeout": 300,
    "gpuCount": 4,
    "promptCache": {"ramMiB": 16384, "ramMiBPerModel": {"Qwen3-27B": 32768}, "reuseChunk": 256},
    "presetGlobals": {"jinja": True, "fa": "on", "ngl": 99, "ctk": "q4_0", "ctv": "q4_0"},
    "models": {
        "Qwen3-4B": {
            "num_instance": 1,
            "gpus": [0, 1],
            "reasoning_effort": {"options": ["low", "medium", "xhigh"], "default": "xhigh"},
            "cost": {"input": 0.4, "cached_input": 0.15, "output": 2.5},
            "model": "/data/Qwen3-4B-Q8_0.gguf",
            "c": 65536,
            "b": 4096,
            "parallel": 4,
        },
        "Qwen3-27B": {"model": "/data/Qwen3-27B.gguf", "gpus": "all", "ngl": 40},
    },
}


def test_the_original_names_map_onto_the_routers_keys(tmp_path: Path) -> None:
    config = evaluate_module(tmp_path, ORIGINAL_STYLE)["config"]
    assert config["router"] == {
        "host": "127.0.0.1",
        "port": 8080,
        "llama_server": LLAMA_SERVER,
        **STATE,
        "max_models_per_gpu": 1,
        "eviction": "lru",
        "queue_force_load_timeout": 300,
        "num_gpus": 4,
    }
    assert config["defaults"] == {"jinja": True, "fa": "on", "ctk": "q4_0", "ctv": "q4_0", "cache-reuse": 256}
    assert config["models"]["Qwen3-4B"] == {
        "num_instance": 1,
        "gpus": [0, 1],
        "reasoning_effort": {"options": ["low", "medium", "xhigh"], "default": "xhigh"},
        "pricing": {"input": 0.4, "cached_input": 0.15, "output": 2.5},
        "model": "/data/Qwen3-4B-Q8_0.gguf",
        "ctx": 65536,
        "b": 4096,
        "parallel": 4,
        "gpu_layers": 99,
        "cram": 16384,
    }
    assert config["models"]["Qwen3-27B"] == {
        "model": "/data/Qwen3-27B.gguf",
        "gpus": "all",
        "gpu_layers": 40,
        "cram": 32768,
    }


def test_the_router_loads_the_rendered_config(tmp_path: Path) -> None:
    config = config_from_dict(evaluate_module(tmp_path, ORIGINAL_STYLE)["config"], tmp_path / "router.toml")
    assert config.router.max_models_per_gpu == 1 and config.router.num_gpus == 4
    assert config.router.eviction == "lru" and config.router.queue_force_load_timeout == 300
    small = config.models["Qwen3-4B"]
    assert (small.ctx, small.parallel, small.gpu_layers, small.gpus) == (65536, 4, 99, (0, 1))
    assert small.pricing is not None and small.pricing.output == 2.5
    assert small.reasoning_effort is not None and small.reasoning_effort.default == "xhigh"
    assert small.cram == 16384 and dict(small.extra_args)["b"] == 4096
    assert config.models["Qwen3-27B"].cram == 32768
    assert dict(config.defaults)["cache-reuse"] == 256


def test_cram_comes_from_the_model_then_its_own_cap_then_the_global_one(tmp_path: Path) -> None:
    models = {
        "own": {"model": "/m/a.gguf", "cram": 1},
        "long": {"model": "/m/b.gguf", "cache-ram": 2},
        "capped": {"model": "/m/c.gguf"},
        "plain": {"model": "/m/d.gguf"},
    }
    cfg: dict[str, Any] = {"models": models, "promptCache": {"ramMiB": 10, "ramMiBPerModel": {"capped": 20}}}
    rendered = settings_of(tmp_path, cfg)["models"]
    assert [rendered[m].get("cram") for m in models] == [1, None, 20, 10]
    assert rendered["long"]["cache-ram"] == 2
    # A cap for every model in [defaults] wins over ramMiB; a model's own cap still applies.
    rendered = settings_of(tmp_path, {**cfg, "presetGlobals": {"cram": 5}})
    assert rendered["defaults"] == {"cram": 5}
    assert [rendered["models"][m].get("cram") for m in models] == [1, None, 20, None]
    # Nothing set: no cram anywhere and no [defaults] table.
    rendered = settings_of(tmp_path, {"models": models, "promptCache": {"ramMiB": None}})
    assert "defaults" not in rendered and "cram" not in rendered["models"]["plain"]


def test_a_models_own_key_wins_over_preset_globals(tmp_path: Path) -> None:
    cfg = {
        "presetGlobals": {"c": 8192, "np": 2, "ctk": "q8_0"},
        "models": {"a": {"model": "/m/a.gguf", "ctx": 4096, "ctk": "f16"}, "b": {"model": "/m/b.gguf"}},
    }
    rendered = settings_of(tmp_path, cfg)
    assert rendered["models"]["a"] == {"model": "/m/a.gguf", "ctx": 4096, "parallel": 2, "ctk": "f16"}
    assert rendered["models"]["b"] == {"model": "/m/b.gguf", "ctx": 8192, "parallel": 2}
    assert rendered["defaults"] == {"ctk": "q8_0"}


def test_a_per_model_cap_for_an_unknown_model_is_an_error(tmp_path: Path) -> None:
    cfg = {"models": {"a": {"model": "/m/a.gguf"}}, "promptCache": {"ramMiBPerModel": {"typo": 1}}}
    result = render_settings(tmp_path, cfg)
    assert result.returncode != 0
    assert "ramMiBPerModel names no model: typo" in result.stderr


def test_every_path_the_service_writes_is_under_its_state_directory(tmp_path: Path) -> None:
    doc = evaluate_module(tmp_path, {"enable": True})
    state = f"/var/lib/{doc['stateDirectory']}"
    assert doc["dynamicUser"] is True and doc["protectSystem"] == "strict"
    for key in ("history_db", "replica_logs", "kv_store_dir"):
        assert doc["config"]["router"][key].startswith(state + "/"), key
    assert doc["environment"] == {"XDG_STATE_HOME": state, "XDG_CACHE_HOME": f"{state}/cache"}
