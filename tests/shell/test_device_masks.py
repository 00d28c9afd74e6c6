"""Vulkan and SYCL builds see only their replica's GPUs: the build's own device list (``--list-devices``)
is matched to the GPUs the router reads, so an integrated GPU that the build lists first is never taken for
GPU 0. Pure matching first, then replicas started by the router: the simulated llama-server lists what
``SIM_LIST_DEVICES`` says and records its environment; the GPU is read through the stand-in NVML."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from router.deploy.masking import BackendDevice, backend_devices, device_masks, has_backend_libraries
from router.placement.budgets import DeviceBudget
from tests.support.client import post_chat
from tests.support.fakenvml import FakeNvml, fake_nvml_fixture  # noqa: F401  (the `fake_nvml` fixture)
from tests.support.harness import running_router
from tests.support.simtools import read_records

MIB = 1 << 20
IGPU = "Vulkan0: Intel(R) UHD Graphics 770 (16000 MiB, 15000 MiB free)"
RTX = "NVIDIA GeForce RTX 3090"
VULKAN = (IGPU, f"Vulkan1: {RTX} (24576 MiB, 24000 MiB free)", f"Vulkan2: {RTX} (24576 MiB, 23000 MiB free)")
ARC = (
    "SYCL0: Intel(R) Arc(TM) A770 Graphics (16225 MiB, 16000 MiB free)",
    "SYCL1: Intel(R) Arc(TM) A380 (6000 MiB)",
)


def card(gpu: int, name: str = RTX, mib: int = 24576) -> DeviceBudget:
    return DeviceBudget(gpu, name=name, total=mib * MIB)


def test_the_lines_of_a_device_list() -> None:
    assert backend_devices(
        [VULKAN[1], "CUDA0: NVIDIA A100-SXM4-80GB (81037 MiB, 80000 MiB free)", "odd"]
    ) == [
        BackendDevice("Vulkan", 1, RTX, 24576),
        BackendDevice("CUDA", 0, "NVIDIA A100-SXM4-80GB", 81037),
    ]


def test_read_gpus_are_matched_by_name_and_size_and_the_integrated_gpu_is_left_out() -> None:
    masks = device_masks(VULKAN, {0: card(0), 1: card(1)}, (0, 1))
    assert masks.env([0]) == {"GGML_VK_VISIBLE_DEVICES": "1"}
    assert masks.env([1]) == {"GGML_VK_VISIBLE_DEVICES": "2"}
    assert masks.env([0, 1]) == {"GGML_VK_VISIBLE_DEVICES": "1,2"}
    assert masks.env([]) == {}  # a CPU replica: nothing to show
    assert device_masks(("CUDA0: x (1 MiB)",), {0: card(0)}, (0,)).env([0]) == {}  # CUDA: its own variable


def test_a_gpu_the_build_does_not_list_gets_no_mask(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="router"):
        masks = device_masks(VULKAN, {0: card(0), 1: card(1, "NVIDIA GeForce RTX 3060", 12288)}, (0, 1))
    assert masks.env([0]) == {"GGML_VK_VISIBLE_DEVICES": "1"} and masks.env([1]) == {}
    assert (
        masks.env([0, 1]) == {}
    )  # one of them unknown: the replica sees every device rather than a wrong one
    assert "GPU 1 (NVIDIA GeForce RTX 3060) is none of the Vulkan devices" in caplog.text
    # the same name but another size is another card
    assert device_masks(VULKAN, {0: card(0, RTX, 12288)}, (0,)).env([0]) == {}


def test_without_readings_gpu_n_is_the_builds_device_n() -> None:
    masks = device_masks(ARC, {}, (0, 1))
    assert masks.env([1]) == {"ONEAPI_DEVICE_SELECTOR": "level_zero:1"}
    assert masks.env([0, 1]) == {"ONEAPI_DEVICE_SELECTOR": "level_zero:0,1"}


def test_a_backend_library_beside_the_build_or_in_its_lib_folder(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "llama-server"
    binary.touch()
    assert not has_backend_libraries(binary)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libggml-vulkan.so").touch()
    assert has_backend_libraries(binary)


async def test_a_vulkan_build_on_an_nvidia_host_masks_each_replica_to_its_card(
    tmp_path: Path, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml.gpu(0, 24576, used_mib=300, name=RTX, bus_id="00000000:01:00.0")
    fake_nvml.gpu(1, 24576, used_mib=300, name=RTX, bus_id="00000000:02:00.0")
    monkeypatch.setenv("SIM_LIST_DEVICES", ";".join(VULKAN))
    (tmp_path / "libggml-vulkan.so").touch()  # beside the (simulated) build: it has a Vulkan backend
    models = {"first": {"gpus": [0]}, "second": {"gpus": [1]}}
    async with running_router(tmp_path, models) as h:
        for name in models:
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
    envs = {name: read_records(h.records_of(name))[0]["env"] for name in models}
    assert envs["first"]["CUDA_VISIBLE_DEVICES"] == "0" and envs["first"]["GGML_VK_VISIBLE_DEVICES"] == "1"
    assert envs["second"]["CUDA_VISIBLE_DEVICES"] == "1" and envs["second"]["GGML_VK_VISIBLE_DEVICES"] == "2"


async def test_a_sycl_build_where_no_gpu_is_read_masks_by_the_builds_own_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_LIST_DEVICES", ";".join(ARC))
    (tmp_path / "libggml-sycl.so").touch()
    async with running_router(tmp_path, {"small": {"gpus": [1]}, "plain": {}}) as h:
        for name in ("small", "plain"):
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
    small = read_records(h.records_of("small"))[0]["env"]
    plain = read_records(h.records_of("plain"))[0]["env"]
    assert small["ONEAPI_DEVICE_SELECTOR"] == "level_zero:1"
    assert plain["ONEAPI_DEVICE_SELECTOR"] == "level_zero:0"  # the build lists devices: GPU 0, not the CPU
