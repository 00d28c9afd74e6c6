"""The stand-in libnvidia-ml.so.1, exercised through the real pynvml module."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakenvml import (
    SONAME,
    FakeNvml,
    FakeNvmlBuildError,
    activate_in_process,
    build_fake_nvml,
    fake_nvml_fixture,  # noqa: F401  (provides the `fake_nvml` fixture)
    import_pynvml,
)

pynvml: Any = import_pynvml()

MiB = 1024 * 1024


def handles() -> list[Any]:
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def procs(handle: Any) -> dict[int, int | None]:
    return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_init_fails_without_state(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.remove_state()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    monkeypatch.delenv("FAKE_NVML_STATE")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    fake_nvml.write()
    fake_nvml.set(fail_init=True)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):  # the variable is still unset
        pynvml.nvmlInit()
    monkeypatch.setenv("FAKE_NVML_STATE", str(fake_nvml.state_path))
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    fake_nvml.set(fail_init=False)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 0
    pynvml.nvmlShutdown()


def test_queries_need_init(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 4096)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1  # init is reference-counted, as in NVML
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_two_gpus(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 24576, used_mib=300, name="NVIDIA GeForce RTX 4090", bus_id="00000000:01:00.0")
    fake_nvml.gpu(1, 4096, name="NVIDIA Fake 4GB", bus_id="00000000:0A:00.0").util(1, 37, 12)
    fake_nvml.set(driver="555.42.06")
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlSystemGetDriverVersion() == "555.42.06"
        h0, h1 = handles()
        m0, m1 = pynvml.nvmlDeviceGetMemoryInfo(h0), pynvml.nvmlDeviceGetMemoryInfo(h1)
        assert (m0.total, m0.used, m0.free) == (24576 * MiB, 300 * MiB, (24576 - 300) * MiB)
        assert (m1.total, m1.used, m1.free) == (4096 * MiB, 0, 4096 * MiB)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
        assert (v2.total, v2.reserved, v2.used, v2.free) == (24576 * MiB, 0, 300 * MiB, (24576 - 300) * MiB)
        assert pynvml.nvmlDeviceGetName(h0) == "NVIDIA GeForce RTX 4090"
        assert pynvml.nvmlDeviceGetName(h1) == "NVIDIA Fake 4GB"
        pci = pynvml.nvmlDeviceGetPciInfo(h1)
        assert pci.busId == "00000000:0A:00.0"
        assert (pci.domain, pci.bus, pci.device) == (0, 0x0A, 0)
        assert pynvml.nvmlDeviceGetPciInfo(h0).busId == "00000000:01:00.0"
        assert pynvml.nvmlDeviceGetUUID(h1) == "GPU-fake-0001"
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID("GPU-fake-0001")) == 1
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId("00000000:0a:00.0")) == 1
        util = pynvml.nvmlDeviceGetUtilizationRates(h1)
        assert (util.gpu, util.memory) == (37, 12)
        assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 0
        assert procs(h0) == {} and pynvml.nvmlDeviceGetGraphicsRunningProcesses(h0) == []
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(2)
    finally:
        pynvml.nvmlShutdown()


def test_static_and_dynamic_processes(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 8192, used_mib=100).gpu(1, 8192)
    fake_nvml.proc(0, 4242, 512)
    fake_nvml.register(os.getpid(), {0: 1024, 1: 256})
    fake_nvml.register(dead_pid(), {0: 2048})
    pynvml.nvmlInit()
    try:
        h0, h1 = handles()
        assert procs(h0) == {4242: 512 * MiB, os.getpid(): 1024 * MiB}
        assert procs(h1) == {os.getpid(): 256 * MiB}
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == (100 + 512 + 1024) * MiB
        assert pynvml.nvmlDeviceGetMemoryInfo(h1).free == (8192 - 256) * MiB
        fake_nvml.unregister(os.getpid())
        assert procs(h0) == {4242: 512 * MiB}
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == (100 + 512) * MiB
    finally:
        pynvml.nvmlShutdown()


def test_a_zombie_holds_no_memory(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 8192)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        fake_nvml.register(child.pid, {0: 3000})
        pynvml.nvmlInit()
        (h0,) = handles()
        assert procs(h0) == {child.pid: 3000 * MiB}
        assert child.stdin is not None
        child.stdin.close()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        assert procs(h0) == {}
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == 0
    finally:
        child.wait()
        pynvml.nvmlShutdown()


def test_many_processes_use_the_sizing_protocol(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 81920)
    for pid in range(1000, 1040):
        fake_nvml.proc(0, pid, 10)
    pynvml.nvmlInit()
    try:
        (h0,) = handles()
        expected = {pid: 10 * MiB for pid in range(1000, 1040)}
        assert procs(h0) == expected
        assert {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h0)} == set(expected)
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == 400 * MiB
        # The unversioned C entry point fills the old {pid, usedGpuMemory} layout.
        fn = pynvml.nvmlLib.nvmlDeviceGetComputeRunningProcesses
        count = ctypes.c_uint(0)
        assert fn(h0, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        assert count.value == 40

        class V1(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

        buf = (V1 * 40)()
        assert fn(h0, ctypes.byref(count), buf) == pynvml.NVML_SUCCESS
        assert [(p.pid, p.usedGpuMemory) for p in buf] == sorted(expected.items())
    finally:
        pynvml.nvmlShutdown()


def test_not_available_memory_is_none(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 4096, used_mib=50).proc(0, 77, None).proc(0, 78, 100)
    pynvml.nvmlInit()
    try:
        (h0,) = handles()
        assert procs(h0) == {77: None, 78: 100 * MiB}
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == 150 * MiB
    finally:
        pynvml.nvmlShutdown()


def test_failure_flags(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 4096).proc(0, 77, 10).set(no_procs=True)
    pynvml.nvmlInit()
    try:
        (h0,) = handles()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetComputeRunningProcesses(h0)
        fake_nvml.set(no_procs=False, fail_memory=True)
        assert procs(h0) == {77: 10 * MiB}
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetMemoryInfo(h0)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
        assert str(pynvml.NVMLError(999)) == "Unknown Error"
    finally:
        pynvml.nvmlShutdown()


def test_state_changes_apply_without_reinit(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 4096)
    pynvml.nvmlInit()
    try:
        (h0,) = handles()
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).free == 4096 * MiB
        fake_nvml.gpu(0, 4096, used_mib=1000, name="Renamed")
        fake_nvml.proc(0, 555, 24.5)
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == int(1024.5 * MiB)
        assert pynvml.nvmlDeviceGetName(h0) == "Renamed"
        fake_nvml.gpu(1, 2048)
        assert pynvml.nvmlDeviceGetCount() == 2
        fake_nvml.remove_gpu(0)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetMemoryInfo(h0)
        fake_nvml.gpu(0, 16384, used_mib=20000)
        assert pynvml.nvmlDeviceGetMemoryInfo(h0).free == 0  # clamped when over-committed
    finally:
        pynvml.nvmlShutdown()


SUBPROCESS_SCRIPT = """
import json, warnings
warnings.simplefilter("ignore")
import pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    ps = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    out.append([pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetPciInfo(h).busId, m.total, m.used, ps])
print(json.dumps({"gpus": out, "lib": pynvml.nvmlLib._name, "fake": pynvml.nvmlLib.fakeNvmlIsFake()}))
"""


def clean_env() -> dict[str, str]:
    drop = {"FAKE_NVML_STATE", "FAKE_NVML_PROCS_DIR", "LD_LIBRARY_PATH"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_subprocess_sees_the_same_gpus(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 8192, used_mib=10, name="NVIDIA Fake A").gpu(1, 4096, name="NVIDIA Fake B")
    fake_nvml.proc(1, 4242, 100)
    fake_nvml.register(os.getpid(), {0: 200})
    done = subprocess.run(
        [sys.executable, "-c", SUBPROCESS_SCRIPT],
        env={**clean_env(), **fake_nvml.env()},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    report = json.loads(done.stdout)
    assert report["lib"] == SONAME and report["fake"] == 1
    assert report["gpus"] == [
        ["NVIDIA Fake A", "00000000:01:00.0", 8192 * MiB, 210 * MiB, {str(os.getpid()): 200 * MiB}],
        ["NVIDIA Fake B", "00000000:02:00.0", 4096 * MiB, 100 * MiB, {"4242": 100 * MiB}],
    ]


def test_preloading_by_path_serves_pynvmls_own_dlopen(fake_nvml: FakeNvml) -> None:
    """Without LD_LIBRARY_PATH, a library loaded by path answers pynvml's CDLL("libnvidia-ml.so.1")."""
    fake_nvml.gpu(0, 1024, name="Preloaded")
    assert fake_nvml.lib_dir is not None
    lib = fake_nvml.lib_dir / SONAME
    script = f"import ctypes; ctypes.CDLL({str(lib)!r}, mode=ctypes.RTLD_GLOBAL)\n" + SUBPROCESS_SCRIPT
    env = {**clean_env(), "FAKE_NVML_STATE": str(fake_nvml.state_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=30
    )
    report = json.loads(done.stdout)
    assert report["lib"] == SONAME and report["fake"] == 1
    assert report["gpus"] == [["Preloaded", "00000000:01:00.0", 1024 * MiB, 0, {}]]


def test_activation_replaces_a_stale_library(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpu(0, 2048, name="Active")
    assert fake_nvml.lib_dir is not None
    pynvml.nvmlLib = ctypes.CDLL(None)  # stands for some other library loaded earlier
    pynvml._nvmlGetFunctionPointer_cache["nvmlInitWithFlags"] = lambda flags: 999
    lib = activate_in_process(fake_nvml.lib_dir)
    assert pynvml.nvmlLib is lib and "nvmlInitWithFlags" not in pynvml._nvmlGetFunctionPointer_cache
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetName(handles()[0]) == "Active"
    finally:
        pynvml.nvmlShutdown()


def test_build_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml_dir = tmp_path / "cache"
    first = build_fake_nvml(fake_nvml_dir)
    stamp = (first / SONAME).stat().st_mtime_ns
    assert build_fake_nvml(fake_nvml_dir) == first
    assert (first / SONAME).stat().st_mtime_ns == stamp
    assert [p.name for p in first.iterdir()] == [SONAME]
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(FakeNvmlBuildError, match="no C compiler"):
        build_fake_nvml(tmp_path / "other")


def test_state_file_text(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path / "f")
    fake.gpu(0, 4096, used_mib=1.5, name="NVIDIA Fake 4GB").util(0, 5).proc(0, 9, None)
    fake.set(no_procs=True, fail_memory=True)
    assert fake.state_path.read_text().splitlines()[1:] == [
        "gpu 0 4096 1.5 00000000:01:00.0 NVIDIA Fake 4GB",
        "util 0 5 0",
        "proc 0 9 na",
        "noprocs",
        "fail memory",
    ]
    assert set(fake.env()) == {"FAKE_NVML_STATE", "FAKE_NVML_PROCS_DIR"}  # no library dir given
    with pytest.raises(ValueError):
        fake.gpu(1, 1024, name="bad\nname")
