"""Real GPU hosts, through the real pynvml on a stand-in libnvidia-ml.so.1 (tests/support/fakenvml).

Budgets mean "what this router may use": total memory minus what other processes hold. Simulated replicas
report the memory they hold to the stand-in (``gpu_mib``), as real llama-server processes show up in NVML's
process list, so reloads, per-process accounting, the baseline fallback and foreign growth are exercised
against the same code paths a real NVIDIA host takes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from router.hosts.gpu_monitor import GpuMonitor
from router.hosts.gpu_readers import AmdSmiSource, GpuReading, NvmlSource, ProcessUse, SysfsSource
from router.placement.budgets import measure
from router.placement.synthetic import SyntheticModel
from tests.support.client import post_chat
from tests.support.fakenvml import FakeNvml, fake_nvml_fixture  # noqa: F401  (the `fake_nvml` fixture)
from tests.support.harness import RouterHandle, running_router
from tests.support.simtools import placed_sim_model, read_records
from tests.support.waiting import until

MIB = 1 << 20
GIB = 1 << 30

# ~0.7 GiB of f16 weights and 16 KiB of KV per token, trained to 1M tokens: the budget decides its context.
BIG = SyntheticModel(
    n_layer=8, n_embd=2048, n_head=16, n_head_kv=4, n_ff=5504, n_vocab=1024, n_ctx_train=1 << 20
)
SMALL = SyntheticModel(
    n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_vocab=1024, n_ctx_train=8192
)


# ------------------------------------------------------------------------------------- pure arithmetic


def reading(used: int, procs: tuple[ProcessUse, ...] | None, total: int = 8 * GIB) -> GpuReading:
    return GpuReading(0, total=total, used=used, processes=procs)


def test_measure_tells_ours_from_foreign() -> None:
    procs = (ProcessUse(10, 2 * GIB), ProcessUse(20, 3 * GIB))
    # None of ours on the GPU: all use is foreign.
    idle = measure(reading(6 * GIB, procs), None, None)
    assert (idle.method, idle.foreign, idle.available) == ("idle", 6 * GIB, 2 * GIB)
    # Process accounting: our pid 20 holds 3 GiB; the rest (1 GiB of driver + pid 10) is foreign.
    split = measure(reading(6 * GIB, procs), {20}, 9 * GIB)
    assert (split.method, split.ours, split.foreign, split.available) == (
        "processes",
        3 * GIB,
        3 * GIB,
        5 * GIB,
    )
    assert split.others == (ProcessUse(10, 2 * GIB),)
    # No process list: the baseline (free while none of ours was there) is trusted.
    base = measure(reading(6 * GIB, None), {20}, 5 * GIB)
    assert (base.method, base.foreign, base.ours, base.available) == ("baseline", 3 * GIB, 3 * GIB, 5 * GIB)
    # A list without our pid (a container with its own pid namespace) is not trusted either.
    hidden = measure(reading(6 * GIB, (ProcessUse(99, 5 * GIB),)), {20}, 5 * GIB)
    assert hidden.method == "baseline" and hidden.available == 5 * GIB
    # Unknown per-process bytes: baseline; no baseline at all: everything counts as foreign.
    unknown = measure(reading(6 * GIB, (ProcessUse(20, None),)), {20}, None)
    assert (unknown.method, unknown.available) == ("unattributed", 2 * GIB)


# ----------------------------------------------------------------------------------- the real pynvml


def test_nvml_source_reads_names_bus_ids_and_processes(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 2048, used_mib=100, name="NVIDIA GeForce RTX 3050", bus_id="00000000:0A:00.0")
    fake_nvml.gpu(1, 4096, used_mib=0, name="NVIDIA T400 4GB", bus_id="00000000:0B:00.0")
    fake_nvml.proc(1, 4242, 1000).proc(1, 4343, None)
    source = NvmlSource.open()
    assert source is not None
    try:
        got = source.read()
    finally:
        source.close()
    assert got[0].name == "NVIDIA GeForce RTX 3050" and got[0].bus_id == "00000000:0A:00.0"
    assert (got[0].total, got[0].used, got[0].free) == (2048 * MIB, 100 * MIB, 1948 * MIB)
    assert got[1].processes == (ProcessUse(4242, 1000 * MIB), ProcessUse(4343, None))
    fake_nvml.set(no_procs=True)
    source = NvmlSource.open()
    assert source is not None and source.read()[1].processes is None
    source.close()
    fake_nvml.set(fail_init=True)
    assert NvmlSource.open() is None


def test_the_monitor_keeps_a_baseline_and_refuses_a_load_into_foreign_memory(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 4096, used_mib=200).set(no_procs=True)
    monitor = GpuMonitor()
    assert monitor.budgets()[0].available == 3896 * MIB and monitor.kind == "nvml"
    fake_nvml.gpu(0, 4096, used_mib=1200)  # ours now holds 1000 MiB; no process list to tell
    again = monitor.budgets({0: {os.getpid()}})[0]
    assert (again.method, again.available, again.ours) == ("baseline", 3896 * MIB, 1000 * MIB)
    # Before a load: planned against 3896 MiB; a foreign program took 2 GiB while the GPU was idle.
    fake_nvml.set(no_procs=False).gpu(0, 4096, used_mib=200).proc(0, 777, 2048)
    refusal = monitor.shortfall("big", {0: 3000 * MIB}, {0: 3896 * MIB}, {})
    assert refusal is not None
    assert "GPU 0 has 4.00 GiB, other processes hold 2.20 GiB (pid 777 2.00 GiB)" in refusal
    assert "big needs 2.93 GiB" in refusal and "planned against 3.80 GiB" in refusal
    # What still fits goes ahead; so does a need that was over budget from the start (an override) when
    # nothing grew.
    assert monitor.shortfall("small", {0: 1000 * MIB}, {0: 3896 * MIB}, {}) is None
    fake_nvml.remove_proc(0, 777)
    assert monitor.shortfall("big", {0: 9000 * MIB}, {0: 3896 * MIB}, {}) is None
    monitor.close()


# --------------------------------------------------------------------------------- the whole router


def nvml_host(fake: FakeNvml) -> None:
    """A 2 GiB and a 4 GiB card, each with 100 MiB taken by the driver."""
    fake.gpu(0, 2048, used_mib=100, name="NVIDIA Fake 2GB", bus_id="00000000:01:00.0")
    fake.gpu(1, 4096, used_mib=100, name="NVIDIA Fake 4GB", bus_id="00000000:02:00.0")


async def wait_records(h: RouterHandle, model: str, count: int = 1) -> list[dict[str, Any]]:
    def records() -> list[dict[str, Any]] | None:
        found = read_records(h.records_of(model))
        return found if len(found) >= count else None

    return await until(records, what=f"{count} start record(s) of {model}")


@pytest.mark.parametrize("accounting", ["processes", "baseline"])
async def test_reload_with_our_replica_resident_plans_the_same_and_restarts_nothing(
    tmp_path: Path, fake_nvml: FakeNvml, accounting: str
) -> None:
    nvml_host(fake_nvml)
    fake_nvml.set(no_procs=accounting == "baseline")
    models = {
        "big": {
            "model": placed_sim_model(tmp_path / "gguf", "big", BIG, gpu_mib=3500),
            "gpus": [1],
            "sim": {},
        }
    }
    async with running_router(tmp_path, models) as h:
        before = (await h.client.get("/plan")).json()
        big = next(m for m in before["models"] if m["name"] == "big")
        assert big["verdict"] == "fits" and big["ctx"] == 165632  # decided by the 3996 MiB budget
        gpu1 = next(d for d in before["devices"] if d["id"] == 1)
        assert gpu1["available_bytes"] == 3996 * MIB and gpu1["method"] == "idle"
        assert gpu1["bus_id"] == "00000000:02:00.0" and gpu1["source"] == "nvml"

        assert (await post_chat(h.client, "big", max_tokens=1)).status_code == 200
        (record,) = await wait_records(h, "big")
        assert record["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert record["env"]["CUDA_VISIBLE_DEVICES"] == "1"
        # The replica now holds 3.5 GiB: free memory on GPU 1 is down to 396 MiB.
        reply = await h.client.post("/reload", json={})
        assert reply.status_code == 200 and reply.json()["restarted"] == [], reply.text
        after = (await h.client.get("/plan")).json()
        gpu1 = next(d for d in after["devices"] if d["id"] == 1)
        assert gpu1["method"] == accounting and gpu1["ours_bytes"] == 3500 * MIB
        assert gpu1["available_bytes"] == 3996 * MIB
        assert next(m for m in after["models"] if m["name"] == "big")["ctx"] == big["ctx"]
        assert (await post_chat(h.client, "big", max_tokens=1)).status_code == 200
        assert len(read_records(h.records_of("big"))) == 1  # the same replica served: nothing restarted
        status = await h.status()
        entry = next(g for g in status["gpus"] if g["id"] == 1)
        assert entry["name"] == "NVIDIA Fake 4GB" and entry["bus_id"] == "00000000:02:00.0"


async def test_foreign_growth_refuses_the_next_load_with_the_arithmetic(
    tmp_path: Path, fake_nvml: FakeNvml
) -> None:
    nvml_host(fake_nvml)
    models = {
        "big": {
            "model": placed_sim_model(tmp_path / "gguf", "big", BIG, gpu_mib=3000),
            "gpus": [1],
            "sim": {},
        },
        "small": {
            "model": placed_sim_model(tmp_path / "gguf", "small", SMALL, gpu_mib=100),
            "gpus": [1],
            "sim": {},
        },
    }
    async with running_router(tmp_path, models) as h:
        assert (await post_chat(h.client, "small", max_tokens=1)).status_code == 200
        fake_nvml.proc(1, 31337, 2500)  # a game starts on GPU 1
        reply = await post_chat(h.client, "big", max_tokens=1)
        assert reply.status_code == 503, reply.text
        message = reply.json()["error"]["message"]
        assert "not enough GPU memory to start big" in message
        assert "other processes hold 2.54 GiB (pid 31337 2.44 GiB)" in message, message
        assert "leaving 1.46 GiB; big needs 3.90 GiB there" in message  # the README's example
        assert not read_records(h.records_of("big"))  # never started into an out-of-memory
        fake_nvml.remove_proc(1, 31337)
        assert (await post_chat(h.client, "big", max_tokens=1)).status_code == 200


async def test_measured_readings_reach_status_and_the_timeline(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    nvml_host(fake_nvml)
    fake_nvml.proc(0, 4242, 300)
    models = {
        "small": {
            "model": placed_sim_model(tmp_path / "gguf", "small", SMALL, gpu_mib=200),
            "gpus": [0],
            "sim": {},
        }
    }
    async with running_router(tmp_path, models) as h:
        assert (await post_chat(h.client, "small", max_tokens=1)).status_code == 200

        async def sampled() -> dict[str, Any] | None:
            timeline = (await h.client.get("/dash/timeline")).json()
            used = timeline["gpus"][0]["used"]
            return dict(timeline) if used and used[-1] == 600 * MIB else None

        timeline = await until(sampled, what="the sampler's reading of our replica")
        gpu0 = timeline["gpus"][0]
        assert timeline["measured"] is True
        assert gpu0["total"][-1] == 2048 * MIB and gpu0["foreign"][-1] == 400 * MIB
        status = await h.status()
        measured = next(g for g in status["gpus"] if g["id"] == 0)["measured"]
        assert measured["method"] == "processes" and measured["ours_bytes"] == 200 * MIB


async def test_an_operator_context_over_budget_loads_anyway(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    nvml_host(fake_nvml)
    big = placed_sim_model(tmp_path / "gguf", "big", BIG)
    models = {"big": {"model": big, "gpus": [0], "ctx": 131072, "sim": {}}}
    async with running_router(tmp_path, models) as h:
        plan = next(m for m in (await h.client.get("/plan")).json()["models"] if m["name"] == "big")
        assert plan["verdict"] == "override" and plan["ctx"] == 131072
        assert "override: predicted" in plan["message"] and "over budget 1.9 GiB on GPU 0" in plan["message"]
        # The scheduler counts it as the whole GPU, not as "can never load".
        assert h.router.state.settings.models["big"].need_on(0) == 1948 * MIB
        reply = await post_chat(h.client, "big", max_tokens=1)
        assert reply.status_code == 200, reply.text
        argv = (await wait_records(h, "big"))[0]["argv"]
        assert argv[argv.index("-c") + 1] == "131072"


# ------------------------------------------------------------------------------- GPUs nobody can read


async def test_a_gpu_whose_memory_cannot_be_read_is_still_a_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No NVML, no amdsmi, no sysfs: full offload at ctx_default, a warning naming memory_mib; only an
    explicit gpus = [] runs on the CPU."""
    models = {
        "big": {"model": placed_sim_model(tmp_path / "gguf", "big", BIG), "gpus": [0], "sim": {}},
        "cpu": {"model": placed_sim_model(tmp_path / "gguf", "cpu", SMALL), "gpus": [], "sim": {}},
    }
    async with running_router(tmp_path, models, router={"ctx_default": 8192}) as h:
        assert (await post_chat(h.client, "big", max_tokens=1)).status_code == 200
        assert (await post_chat(h.client, "cpu", max_tokens=1)).status_code == 200
        plan = {m["name"]: m for m in (await h.client.get("/plan")).json()["models"]}
        status = await h.status()
        big = (await wait_records(h, "big"))[0]
        cpu = (await wait_records(h, "cpu"))[0]
    assert plan["big"]["verdict"] == "unknown-budget" and plan["big"]["ctx"] == 8192
    assert "[devices.N] memory_mib" in plan["big"]["message"]
    argv = big["argv"]
    assert argv[argv.index("-ngl") + 1] == str(BIG.n_layer + 1) and argv[argv.index("-c") + 1] == "8192"
    assert big["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert plan["cpu"]["verdict"] == "fits" and plan["cpu"]["gpu_layers"] == 0
    assert cpu["argv"][cpu["argv"].index("-ngl") + 1] == "0" and cpu["env"]["CUDA_VISIBLE_DEVICES"] == ""
    (gpu0,) = status["gpus"]
    assert gpu0["budget_bytes"] is None and "[devices.0] memory_mib" in gpu0["warning"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("GPU 0: its memory cannot be read" in w and "[devices.0] memory_mib" in w for w in warnings)


def sysfs_card(root: Path, card: str, bus: str, vendor: str, total_mib: int, used_mib: int) -> None:
    device = root / "devices" / "pci0000:00" / bus
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "mem_info_vram_total").write_text(f"{total_mib * MIB}\n")
    (device / "mem_info_vram_used").write_text(f"{used_mib * MIB}\n")
    (device / "product_name").write_text(f"Radeon {total_mib // 1024}G\n")
    link = root / "class" / "drm" / card
    link.mkdir(parents=True)
    (link / "device").symlink_to(device)


def test_amd_gpus_through_sysfs_in_pci_bus_order(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    sysfs_card(root, "card0", "0000:0b:00.0", "0x1002", 16384, 1024)
    sysfs_card(root, "card1", "0000:03:00.0", "0x1002", 8192, 512)
    sysfs_card(root, "card2", "0000:01:00.0", "0x10de", 4096, 0)  # not AMD: NVML's business
    (root / "class" / "drm" / "renderD128").mkdir()
    (root / "class" / "drm" / "card0-DP-1").mkdir()
    source = SysfsSource.open(root)
    assert source is not None and source.kind == "sysfs"
    got = source.read()
    assert [(g.bus_id, g.total // MIB, g.used // MIB, g.name) for g in got.values()] == [
        ("0000:03:00.0", 8192, 512, "Radeon 8G"),
        ("0000:0b:00.0", 16384, 1024, "Radeon 16G"),
    ]
    assert got[0].processes is None
    monitor = GpuMonitor(opener=lambda: source)
    budgets = monitor.budgets()
    assert budgets[1].available == 15360 * MIB and budgets[1].source == "sysfs"
    # With one of ours on GPU 1, the kept baseline says what is ours: the budget does not shrink.
    (root / "devices" / "pci0000:00" / "0000:0b:00.0" / "mem_info_vram_used").write_text(f"{9000 * MIB}\n")
    again = monitor.budgets({1: {12345}})
    assert (again[1].method, again[1].available, again[1].ours) == ("baseline", 15360 * MIB, 7976 * MIB)
    assert SysfsSource.open(tmp_path / "nothing") is None


class StandInAmdSmi:
    """The calls of the amdsmi module that AmdSmiSource makes, for one 24 GiB card (the real module needs
    ROCm's library, which this machine does not have)."""

    def __init__(self) -> None:
        self.closed = False

    def amdsmi_init(self) -> None: ...

    def amdsmi_shut_down(self) -> None:
        self.closed = True

    def amdsmi_get_processor_handles(self) -> list[str]:
        return ["h1", "h0"]

    def amdsmi_get_gpu_device_bdf(self, handle: str) -> str:
        return {"h0": "0000:03:00.0", "h1": "0000:0c:00.0"}[handle]

    def amdsmi_get_gpu_vram_usage(self, handle: str) -> dict[str, int]:
        return {"vram_total": 24560, "vram_used": 2000 if handle == "h0" else 10}

    def amdsmi_get_gpu_asic_info(self, handle: str) -> dict[str, str]:
        return {"market_name": "Radeon RX 7900 XTX"}

    def amdsmi_get_gpu_process_list(self, handle: str) -> list[dict[str, Any]]:
        if handle == "h1":
            return []
        return [{"pid": 4242, "memory_usage": {"vram_mem": 1500 * MIB}}]


def test_amd_gpus_through_amdsmi_with_process_accounting() -> None:
    smi = StandInAmdSmi()
    source = AmdSmiSource.open(lambda: smi)
    assert source is not None
    got = source.read()
    assert [(g.bus_id, g.used // MIB) for g in got.values()] == [("0000:03:00.0", 2000), ("0000:0c:00.0", 10)]
    assert got[0].processes == (ProcessUse(4242, 1500 * MIB),) and got[0].name == "Radeon RX 7900 XTX"
    ours = GpuMonitor(opener=lambda: source).budgets({0: {4242}})[0]
    assert (ours.method, ours.ours, ours.available) == ("processes", 1500 * MIB, 24060 * MIB)
    source.close()
    assert smi.closed
