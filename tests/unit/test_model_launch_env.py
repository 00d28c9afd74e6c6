"""How a model's own binary and env shape its launch: the binary on the command line, the environment beside
the GPU masks, the masks of its own build, and which models a reload restarts."""

from __future__ import annotations

from typing import Any

import attrs

from router.config.load import config_from_dict
from router.deploy.deployment import Deployment, changed_models
from router.deploy.launch import default_decision, launches, scheduler_settings
from router.deploy.masking import Masks
from statemachine import Settings

ROUTER_MASKS = Masks({"Vulkan": {0: 0, 1: 1}})
OWN_MASKS = Masks({"Vulkan": {0: 1, 1: 2}})


def _config(**own: Any) -> Any:
    return config_from_dict(
        {
            "router": {"num_gpus": 2},
            "models": {
                "own": {"model": "/m/own.gguf", "gpus": [1], "llama_server": "/opt/vk/llama-server", **own},
                "plain": {"model": "/m/plain.gguf", "gpus": [0]},
            },
        }
    )


def _deployment(config: Any, masks: dict[str, Masks] | None = None) -> Deployment:
    decisions = {name: default_decision(model) for name, model in config.models.items()}
    built = launches(
        config, "/usr/bin/llama-server", (0, 1), decisions, {"own": "/opt/vk/llama-server"}, masks
    )
    settings: Settings = scheduler_settings(config, (0, 1), decisions, {0: None, 1: None})
    return Deployment(config, settings, built, {}, (), masks=ROUTER_MASKS)


def test_the_model_runs_its_own_binary_with_its_env_beside_the_masks() -> None:
    built = _deployment(_config(env={"GGML_VK_PREFER_HOST_MEMORY": "1"}), {"/opt/vk/llama-server": OWN_MASKS})
    own, plain = built.launches["own"], built.launches["plain"]
    assert own.argv(9)[0] == "/opt/vk/llama-server" and plain.argv(9)[0] == "/usr/bin/llama-server"
    assert own.environment((1,), built.masks) == {
        "GGML_VK_PREFER_HOST_MEMORY": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1",
        "HIP_VISIBLE_DEVICES": "1",
        "GGML_VK_VISIBLE_DEVICES": "2",  # its own build's numbering
    }
    assert plain.environment((0,), built.masks)["GGML_VK_VISIBLE_DEVICES"] == "0"  # the router's build's
    assert "GGML_VK_PREFER_HOST_MEMORY" not in plain.environment((0,), built.masks)


def test_a_reload_restarts_the_model_whose_env_or_build_masks_changed() -> None:
    before = _deployment(_config(env={"A": "1"}))
    assert changed_models(before, _deployment(_config(env={"A": "1"}))) == frozenset()
    assert changed_models(before, _deployment(_config(env={"A": "2"}))) == {"own"}
    assert changed_models(before, _deployment(_config())) == {"own"}
    masked = _deployment(_config(env={"A": "1"}), {"/opt/vk/llama-server": OWN_MASKS})
    assert changed_models(before, masked) == {"own"}
    # Another binary is another command line.
    other = attrs.evolve(
        before, launches={**before.launches, "own": attrs.evolve(before.launches["own"], binary="/x")}
    )
    assert changed_models(before, other) == {"own"}
