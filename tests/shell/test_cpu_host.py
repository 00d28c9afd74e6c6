"""A host without any GPU: the models that name no GPUs run on the CPU with no `num_gpus = 0`, a model that
names one keeps it, and a build that lists a device (a GPU the router has no reader for) changes nothing.

The simulated llama-server answers ``--list-devices`` with what ``SIM_LIST_DEVICES`` says (one simulated
GPU when unset); the real CPU build lists none."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from router.hosts.server_devices import parse_devices
from router.placement.synthetic import SyntheticModel
from tests.support.client import post_chat
from tests.support.harness import running_router, serving
from tests.support.realharness import real_document
from tests.support.simtools import read_records

CUDA = """ggml_cuda_init: found 2 CUDA devices:
Available devices:
  CUDA0: NVIDIA GeForce RTX 3090 (24135 MiB, 23000 MiB free)
  CUDA1: NVIDIA GeForce RTX 3060 (12041 MiB, 11800 MiB free)
"""


def test_the_device_list_of_a_build() -> None:
    assert parse_devices(CUDA) == (
        "CUDA0: NVIDIA GeForce RTX 3090 (24135 MiB, 23000 MiB free)",
        "CUDA1: NVIDIA GeForce RTX 3060 (12041 MiB, 11800 MiB free)",
    )
    assert parse_devices("Available devices:\n  (none)\n") == ()
    assert parse_devices("error: invalid argument: --list-devices\n") is None  # an older build: unknown


def ngl(record: dict[str, object]) -> str:
    argv = record["argv"]
    assert isinstance(argv, list)
    return str(argv[argv.index("-ngl") + 1])


async def test_on_a_host_without_gpus_the_models_that_name_none_run_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SIM_LIST_DEVICES", "none")
    small = SyntheticModel()  # header-only GGUF files: placement predicts their memory
    models = {"plain": {"shape": small}, "named": {"gpus": [0], "shape": small}}
    with caplog.at_level(logging.WARNING, logger="router"):
        async with running_router(tmp_path, models) as h:
            for name in models:
                assert (await post_chat(h.client, name, max_tokens=2)).status_code == 200
            status = await h.status()
            plan = {m["name"]: m for m in (await h.client.get("/plan")).json()["models"]}
    (plain,) = read_records(h.records_of("plain"))
    (named,) = read_records(h.records_of("named"))
    assert ngl(plain) == "0" and plain["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert ngl(named) != "0" and named["env"]["CUDA_VISIBLE_DEVICES"] == "0"  # named: never a silent -ngl 0
    assert {r["model"]: r["gpus"] for r in status["replicas"]} == {"plain": [], "named": [0]}
    assert plan["plain"]["need_by_gpu"] == {} and "fits: CPU" in plan["plain"]["message"]  # host memory
    assert list(plan["named"]["need_by_gpu"]) == ["0"]
    told = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no GPU found")]
    assert len(told) == 1 and "plain run on the CPU" in told[0] and "named name GPUs" in told[0]


async def test_a_build_that_lists_a_device_keeps_the_default_gpu(tmp_path: Path) -> None:
    """No reader finds a GPU here, but the (simulated) build lists one: a Metal or Vulkan host."""
    async with running_router(tmp_path, {"plain": {}}) as h:
        assert (await post_chat(h.client, "plain", max_tokens=2)).status_code == 200
    (plain,) = read_records(h.records_of("plain"))
    assert ngl(plain) != "0" and plain["env"]["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.real
async def test_the_real_cpu_build_runs_a_model_that_names_no_gpu_on_the_cpu(tmp_path: Path) -> None:
    doc = real_document(tmp_path, {"a": {"gpus": None}})
    async with serving(tmp_path, doc) as h:
        reply = await post_chat(h.client, "a", max_tokens=2)
        (replica,) = (await h.status())["replicas"]
    assert reply.status_code == 200, reply.text
    assert replica["gpus"] == []
