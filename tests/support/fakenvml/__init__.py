"""A stand-in ``libnvidia-ml.so.1`` for testing GPU code paths through the real ``pynvml`` module.

``fake_nvml.c`` (next to this file) implements the part of the NVML C API that pynvml uses for
device enumeration, memory, running processes, PCI bus ids, UUIDs, utilisation and the driver
version. It reads its state on every call from the file named by ``$FAKE_NVML_STATE``, so a test
changes the simulated hardware by rewriting that file; no re-initialisation is needed.

State file, one directive per line, ``#`` comments::

    gpu INDEX TOTAL_MIB BASE_USED_MIB PCI_BUS_ID NAME...   # NAME is the rest of the line
    proc GPU_INDEX PID USED_MIB                           # USED_MIB may be `na` (not available)
    util GPU_INDEX GPU_PERCENT [MEMORY_PERCENT]
    driver VERSION
    noprocs                # compute-process queries return NVML_ERROR_NOT_SUPPORTED
    fail init              # nvmlInit* returns NVML_ERROR_UNKNOWN
    fail memory            # nvmlDeviceGetMemoryInfo* returns NVML_ERROR_GPU_IS_LOST

With ``$FAKE_NVML_STATE`` unset or naming a missing file, ``nvmlInit`` fails with
NVML_ERROR_DRIVER_NOT_LOADED, as on a machine without the driver.

Dynamic processes: each file ``$FAKE_NVML_PROCS_DIR/<pid>`` holds lines ``GPU_INDEX USED_MIB``;
the pid then holds that memory, as long as it is alive (a dead or zombie pid's file is ignored).
A simulated server calls :func:`register_process` with its own pid.

Used memory of a GPU = BASE_USED_MIB + all numeric process amounts on it; free = total - used.

Usage in a test::

    from tests.support.fakenvml import FakeNvml, fake_nvml_fixture  # noqa: F401  (provides `fake_nvml`)

    def test_something(fake_nvml: FakeNvml) -> None:
        fake_nvml.gpu(0, 24576, used_mib=300, name="NVIDIA GeForce RTX 4090")
        fake_nvml.proc(0, 4242, 1024)
        ...  # code calling pynvml in this process, or a subprocess run with env=fake_nvml.env()
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Self

import pytest

__all__ = [
    "SONAME",
    "SOURCE",
    "FakeNvml",
    "FakeNvmlBuildError",
    "activate_in_process",
    "build_fake_nvml",
    "default_cache_dir",
    "fake_nvml_fixture",
    "import_pynvml",
    "register_process",
    "unregister_process",
]

SONAME = "libnvidia-ml.so.1"
SOURCE = Path(__file__).with_name("fake_nvml.c")

_build_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


class FakeNvmlBuildError(RuntimeError):
    """The stand-in library could not be compiled (no C compiler, or the compiler failed)."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/llama-router/fake-nvml`` (``~/.cache/...`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama-router" / "fake-nvml"


def _compiler() -> list[str]:
    cc = shlex.split(os.environ.get("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        shown = os.environ.get("CC") or "cc"
        raise FakeNvmlBuildError(
            f"no C compiler found (tried {shown!r}); install one (e.g. gcc) or point $CC at it "
            f"to build the stand-in {SONAME} from {SOURCE}"
        )
    return cc


def build_fake_nvml(cache_dir: Path) -> Path:
    """Compile ``fake_nvml.c`` once; return the directory that holds ``libnvidia-ml.so.1``.

    The build lands in ``cache_dir/<key>/`` where ``key`` hashes the source and the compiler
    command, so an edited source gets a fresh build and an up-to-date one is reused. The library
    is written under a temporary name and renamed into place, so concurrent builders are safe.
    """
    cc = _compiler()
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + b"\0" + "\0".join(cc).encode()).hexdigest()[:16]
    out_dir = Path(cache_dir) / key
    lib = out_dir / SONAME
    with _build_lock:
        if lib.is_file():
            return out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{SONAME}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        cmd = [*cc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{SONAME}", "-o", str(tmp), str(SOURCE)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise FakeNvmlBuildError(
                    f"building the stand-in {SONAME} failed ({shlex.join(cmd)}, exit {done.returncode}):\n"
                    f"{done.stdout}{done.stderr}"
                )
            os.replace(tmp, lib)
        except OSError as exc:
            raise FakeNvmlBuildError(f"building the stand-in {SONAME} failed: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
    return out_dir


def import_pynvml() -> ModuleType:
    """``import pynvml`` without the deprecation warning its ``pynvml`` package wrapper emits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import pynvml

    return pynvml


def activate_in_process(lib_dir: Path) -> ctypes.CDLL:
    """Make this process's ``pynvml`` use the stand-in library in ``lib_dir``.

    The library is loaded with ``RTLD_GLOBAL`` under its full path. glibc then answers a later
    ``dlopen("libnvidia-ml.so.1")`` (what pynvml's ``CDLL`` does) with this object, matched by its
    DT_SONAME, so code importing pynvml afterwards finds it. pynvml's module-level ``nvmlLib`` is
    also pointed at it (and its function-pointer cache dropped) when it held anything else, e.g. a
    real NVML or an earlier build. Returns the loaded library; it also exports ``fakeNvmlReset()``.
    """
    path = str(Path(lib_dir).resolve() / SONAME)
    lib = _loaded.get(path)
    if lib is None:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        _loaded[path] = lib
    pynvml = import_pynvml()
    with pynvml.libLoadLock:
        current = pynvml.nvmlLib
        if current is None or getattr(current, "_handle", None) != lib._handle:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()
    return lib


def _check_line_text(what: str, text: str) -> None:
    if any(c in text for c in "\n\r#"):
        raise ValueError(f"{what} may not contain a newline or '#': {text!r}")


def _amount(mib: float) -> str:
    if mib < 0:
        raise ValueError(f"memory amounts are non-negative MiB, got {mib}")
    return str(int(mib)) if float(mib).is_integer() else repr(float(mib))


def register_process(procs_dir: Path, pid: int, usage: Mapping[int, float]) -> Path:
    """Declare that ``pid`` holds ``usage[gpu]`` MiB on each listed GPU (replacing earlier usage).

    Writes ``procs_dir/<pid>`` atomically. The entry vanishes from NVML's view once ``pid`` exits.
    """
    procs_dir = Path(procs_dir)
    procs_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{int(gpu)} {_amount(mib)}\n" for gpu, mib in usage.items())
    target = procs_dir / str(int(pid))
    _atomic_write(target, text)
    return target


def unregister_process(procs_dir: Path, pid: int) -> None:
    """Drop ``pid``'s dynamic process file, if any."""
    (Path(procs_dir) / str(int(pid))).unlink(missing_ok=True)


def _atomic_write(target: Path, text: str) -> None:
    # The temporary name starts with a dot, so the library never mistakes it for a pid file.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass
class FakeGpu:
    """One simulated GPU as written to the state file."""

    index: int
    total_mib: int
    used_mib: float
    name: str
    bus_id: str
    util_gpu: int = 0
    util_memory: int = 0


class FakeNvml:
    """Builder for the stand-in's state: ``dir/state`` plus the dynamic process directory ``dir/procs``.

    Every mutating method rewrites the state file at once (atomically), so running code sees the
    change on its next NVML call. Methods return ``self`` to allow chaining.
    """

    def __init__(self, dir: Path, lib_dir: Path | None = None) -> None:
        self.dir = Path(dir)
        self.state_path = self.dir / "state"
        self.procs_dir = self.dir / "procs"
        self.lib_dir = lib_dir
        self.gpus: dict[int, FakeGpu] = {}
        self.procs: dict[tuple[int, int], float | None] = {}
        self.no_procs = False
        self.fail_init = False
        self.fail_memory = False
        self.driver: str | None = None
        self.procs_dir.mkdir(parents=True, exist_ok=True)
        self.write()

    # -- hardware -------------------------------------------------------------------------------

    def gpu(
        self,
        index: int,
        total_mib: int,
        used_mib: float = 0,
        name: str = "NVIDIA Fake 4GB",
        bus_id: str | None = None,
    ) -> Self:
        """Add or replace GPU ``index`` (write indices 0..N-1). ``used_mib`` is the base usage, before
        processes. ``bus_id`` defaults to ``00000000:0X:00.0`` with X = index + 1."""
        if not 0 <= index < 16:
            raise ValueError(f"GPU index must be 0..15, got {index}")
        bus = bus_id or f"00000000:{index + 1:02X}:00.0"
        _check_line_text("GPU name", name)
        _check_line_text("bus id", bus)
        if not name.strip() or not bus.strip() or any(c.isspace() for c in bus):
            raise ValueError(f"bad GPU name {name!r} or bus id {bus!r}")
        _amount(used_mib)
        old = self.gpus.get(index)
        self.gpus[index] = FakeGpu(
            index=index,
            total_mib=int(total_mib),
            used_mib=used_mib,
            name=name,
            bus_id=bus,
            util_gpu=old.util_gpu if old else 0,
            util_memory=old.util_memory if old else 0,
        )
        self.write()
        return self

    def remove_gpu(self, index: int) -> Self:
        """Take GPU ``index`` away; handles to it then fail with NVMLError_GpuIsLost."""
        self.gpus.pop(index, None)
        self.write()
        return self

    def util(self, gpu: int, percent: int, memory_percent: int = 0) -> Self:
        """Set what nvmlDeviceGetUtilizationRates reports for ``gpu``."""
        g = self.gpus[gpu]
        g.util_gpu, g.util_memory = int(percent), int(memory_percent)
        self.write()
        return self

    # -- processes ------------------------------------------------------------------------------

    def proc(self, gpu: int, pid: int, mib: float | None) -> Self:
        """A static (foreign) process holding ``mib`` MiB on ``gpu``; ``None`` = not available."""
        if mib is not None:
            _amount(mib)
        self.procs[(int(gpu), int(pid))] = mib
        self.write()
        return self

    def remove_proc(self, gpu: int, pid: int) -> Self:
        self.procs.pop((int(gpu), int(pid)), None)
        self.write()
        return self

    def register(self, pid: int, usage: Mapping[int, float]) -> Path:
        """A dynamic process: ``pid`` holds ``usage[gpu]`` MiB while it lives (see register_process)."""
        return register_process(self.procs_dir, pid, usage)

    def unregister(self, pid: int) -> None:
        unregister_process(self.procs_dir, pid)

    # -- flags and files ------------------------------------------------------------------------

    def set(
        self,
        *,
        no_procs: bool | None = None,
        fail_init: bool | None = None,
        fail_memory: bool | None = None,
        driver: str | None = None,
    ) -> Self:
        """Change the given flags (``None`` leaves one as it is) and rewrite the state file."""
        if no_procs is not None:
            self.no_procs = no_procs
        if fail_init is not None:
            self.fail_init = fail_init
        if fail_memory is not None:
            self.fail_memory = fail_memory
        if driver is not None:
            if not driver or any(c.isspace() or c == "#" for c in driver):
                raise ValueError(f"bad driver version {driver!r}")
            self.driver = driver
        self.write()
        return self

    def render(self) -> str:
        """The state file's text for the current settings."""
        lines = ["# stand-in NVML state"]
        if self.driver:
            lines.append(f"driver {self.driver}")
        for g in sorted(self.gpus.values(), key=lambda g: g.index):
            lines.append(f"gpu {g.index} {g.total_mib} {_amount(g.used_mib)} {g.bus_id} {g.name}")
            if g.util_gpu or g.util_memory:
                lines.append(f"util {g.index} {g.util_gpu} {g.util_memory}")
        for (gpu, pid), mib in self.procs.items():
            lines.append(f"proc {gpu} {pid} {'na' if mib is None else _amount(mib)}")
        if self.no_procs:
            lines.append("noprocs")
        if self.fail_init:
            lines.append("fail init")
        if self.fail_memory:
            lines.append("fail memory")
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        """(Re)write the state file atomically (temporary file + rename)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.state_path, self.render())

    def remove_state(self) -> None:
        """Delete the state file: nvmlInit then fails as if no driver were loaded."""
        self.state_path.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        """Variables for a subprocess to see this state: merge into its environment."""
        out = {"FAKE_NVML_STATE": str(self.state_path), "FAKE_NVML_PROCS_DIR": str(self.procs_dir)}
        if self.lib_dir is not None:
            old = os.environ.get("LD_LIBRARY_PATH", "")
            parts = [str(self.lib_dir), *[p for p in old.split(os.pathsep) if p and p != str(self.lib_dir)]]
            out["LD_LIBRARY_PATH"] = os.pathsep.join(parts)
        return out


@pytest.fixture(name="fake_nvml")
def fake_nvml_fixture(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeNvml]:
    """Fixture ``fake_nvml``: a :class:`FakeNvml` with no GPUs yet, active for pynvml here and in children.

    The library is built once per test session (under pytest's base temp dir) and loaded into
    this process; its init count is reset, so each test starts uninitialised. ``FAKE_NVML_STATE``,
    ``FAKE_NVML_PROCS_DIR`` and ``LD_LIBRARY_PATH`` are set in ``os.environ`` for the test.
    """
    if not sys.platform.startswith("linux"):
        pytest.skip("the stand-in NVML library is Linux-only")
    lib_dir = build_fake_nvml(tmp_path_factory.getbasetemp() / "fake-nvml-lib")
    lib = activate_in_process(lib_dir)
    lib.fakeNvmlReset()
    fake = FakeNvml(tmp_path / "fake-nvml", lib_dir)
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    yield fake
    lib.fakeNvmlReset()
