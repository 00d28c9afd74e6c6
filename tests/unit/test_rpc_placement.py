"""RPC devices from the configuration to placement, the replica's command line and the scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.llama_args import gpu_env
from router.config.load import Config, ConfigError, config_from_dict
from router.deploy.bridge import plan
from router.deploy.launch import check_pinned, launches, scheduler_settings
from router.deploy.rpc_devices import RPC_BASE, local_gpus
from router.hosts.gpu_monitor import GpuMonitor
from router.placement.synthetic import SyntheticModel, write_header_only
from statemachine import (
    Kill,
    KillCause,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Spawn,
    check,
    initial_state,
    step,
)

MiB = 1 << 20
# ~25 MiB of weights, trained on 8k tokens.
SMALL = SyntheticModel(
    n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_vocab=1024, n_ctx_train=8192
)
# ~2.6 GiB of weights: more than a 1 GiB RPC device holds.
BIG = SyntheticModel(n_layer=8, n_embd=4096, n_head=32, n_head_kv=8, n_ff=11008, n_vocab=1024)


@pytest.fixture
def small(tmp_path: Path) -> str:
    (path,) = write_header_only(tmp_path / "small.gguf", SMALL)
    return str(path)


def configure(models: dict[str, Any], *, router: dict[str, Any] | None = None) -> Config:
    return config_from_dict(
        {
            "router": {"num_gpus": 1, **(router or {})},
            "devices": {"0": {"memory_mib": 4096}},
            "rpc_devices": {
                "box": {"endpoint": "127.0.0.1:50052", "memory_mib": 2048},
                "spare": {"endpoint": "10.0.0.7:50052", "memory_mib": 1024},
            },
            "models": models,
        }
    )


def deployed(config: Config) -> tuple[Any, ...]:
    ids, budgets, decisions, document = plan(config, GpuMonitor(lambda: None))
    return ids, budgets, decisions, document, scheduler_settings(config, ids, decisions, budgets)


def test_a_model_on_a_gpu_and_an_rpc_device_splits_in_llama_cpp_order(small: str) -> None:
    config = configure({"m": {"model": small, "gpus": [0], "rpc": ["box"]}})
    ids, budgets, decisions, document, settings = deployed(config)
    box = RPC_BASE  # the first [rpc_devices] table
    assert ids == (0,) and budgets[box] == 2048 * MiB and budgets[0] == 4096 * MiB
    model = next(m for m in document["models"] if m["name"] == "m")
    assert model["verdict"] == "fits"
    # llama.cpp numbers RPC devices first, then local GPUs: the split and the rows follow that order.
    assert [row["device"] for row in model["devices"]] == [box, 0]
    assert model["tensor_split"] == [2048, 4096]
    assert all(row["layers"] > 0 and row["total_bytes"] > 0 for row in model["devices"])
    assert set(model["need_by_gpu"]) == {str(box), "0"}
    kinds = {d["id"]: d["kind"] for d in document["devices"]}
    assert kinds[box] == "rpc" and kinds[0] == "gpu" and RPC_BASE + 1 in kinds

    argv = launches(config, "llama-server", ids, decisions)["m"].argv(8000)
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:50052"
    assert argv[argv.index("--tensor-split") + 1] == "2048,4096"
    assert argv[argv.index("-ngl") + 1] == str(model["gpu_layers"])

    spec = settings.models["m"]
    assert spec.gpus == (box, 0)
    assert settings.budget(box) == 2048 * MiB and settings.budget(RPC_BASE + 1) == 1024 * MiB
    # The GPU's share is the prediction; the RPC device is held whole (one client at a time).
    assert spec.need_on(0) == model["need_by_gpu"]["0"]
    assert 0 < model["need_by_gpu"][str(box)] < spec.need_on(box) == 2048 * MiB
    # Only local GPUs are masked.
    assert local_gpus(spec.gpus) == (0,)
    assert gpu_env(local_gpus(spec.gpus))["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_model_on_rpc_devices_only_offloads_every_layer_and_sees_no_local_gpu(small: str) -> None:
    config = configure({"m": {"model": small, "gpus": [], "rpc": ["spare", "box"]}})
    ids, _, decisions, document, settings = deployed(config)
    model = document["models"][0]
    assert model["verdict"] == "fits" and model["gpu_layers"] == SMALL.n_layer + 1
    assert [row["device"] for row in model["devices"]] == [RPC_BASE + 1, RPC_BASE]
    assert model["tensor_split"] == [1024, 2048]
    argv = launches(config, "llama-server", ids, decisions)["m"].argv(8000)
    assert argv[argv.index("--rpc") + 1] == "10.0.0.7:50052,127.0.0.1:50052"
    spec = settings.models["m"]
    assert spec.gpus == (RPC_BASE + 1, RPC_BASE)
    assert gpu_env(local_gpus(spec.gpus))["CUDA_VISIBLE_DEVICES"] == ""


def test_a_model_too_large_for_the_rpc_device_is_refused_with_the_arithmetic(tmp_path: Path) -> None:
    (big,) = write_header_only(tmp_path / "big.gguf", BIG)
    config = configure({"big": {"model": str(big), "gpus": [], "rpc": ["spare"]}})
    _, _, decisions, document, settings = deployed(config)
    model = document["models"][0]
    assert model["verdict"] == "refused"
    message = model["message"]
    assert "big needs ~" in message and "on RPC spare (10.0.0.7:50052)" in message, message
    assert "RPC spare (10.0.0.7:50052) has 1.0 GiB" in message and "weights" in message
    assert settings.models["big"].refusal == message == decisions["big"].refusal


def test_two_models_on_one_rpc_device_swap_even_under_a_higher_cap(small: str) -> None:
    config = configure(
        {
            "a": {"model": small, "gpus": [], "rpc": ["box"]},
            "b": {"model": small, "gpus": [], "rpc": ["box"]},
            "c": {"model": small, "gpus": [0]},
        },
        router={"max_models_per_gpu": 2},
    )
    *_, settings = deployed(config)
    state = initial_state(settings)

    def feed(event: Any) -> list[Any]:
        nonlocal state
        state, commands = step(state, event)
        check(state)
        return list(commands)

    (spawn_a,) = [c for c in feed(RequestArrived(1, "a")) if isinstance(c, Spawn)]
    assert spawn_a.gpus == (RPC_BASE,)
    feed(ReplicaReady(spawn_a.replica))
    feed(RequestFinished(1))
    # b needs the device a holds: a is evicted first, b starts once a has exited.
    commands = feed(RequestArrived(2, "b"))
    kills = [c for c in commands if isinstance(c, Kill)]
    assert [(k.replica, k.cause) for k in kills] == [(spawn_a.replica, KillCause.EVICTED)]
    assert not [c for c in commands if isinstance(c, Spawn)]
    (spawn_b,) = [c for c in feed(ReplicaExited(spawn_a.replica, "evicted")) if isinstance(c, Spawn)]
    assert spawn_b.model == "b" and spawn_b.gpus == (RPC_BASE,)
    # A model on a local GPU is untouched by the swap on the RPC device.
    (spawn_c,) = [c for c in feed(RequestArrived(3, "c")) if isinstance(c, Spawn)]
    assert spawn_c.gpus == (0,)


def test_two_pinned_models_on_one_rpc_device_are_refused(small: str) -> None:
    config = configure(
        {
            "a": {"model": small, "gpus": [], "rpc": ["box"], "pinned": True},
            "b": {"model": small, "gpus": [0], "rpc": ["box"], "pinned": True},
        },
        router={"max_models_per_gpu": 2},
    )
    *_, settings = deployed(config)
    with pytest.raises(ConfigError) as info:
        check_pinned(config, settings)
    assert info.value.key == "rpc_devices.box" and "one client at a time" in info.value.detail
