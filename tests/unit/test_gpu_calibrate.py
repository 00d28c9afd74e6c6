"""scripts/gpu-calibrate: its parsing and comparison on captured text, its refusal without a GPU, and a
whole CPU dry run on tiny models through the real router and llama-server (marked ``real``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from scripts.calibrate import compare, parsing
from tests.support.realenv import require_llama_server, require_vocab_dir

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-calibrate"
MiB = 1 << 20


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_calibrate", ROOT / "scripts" / "gpu_calibrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gc = _load()

# A CUDA replica's log file (GET /logs/{replica}) while qwen-shape loads.
REPLICA_LOG = """\
--- 2026-01-01 10:00:00 replica 1 of qwen-shape: llama-server -m qwen-shape.gguf --port 40001
--- 2026-01-01 10:00:00 started pid 4242 on port 40001
0.00.600.100 I load_tensors: offloaded 25/25 layers to GPU
0.00.600.200 I load_tensors:   CPU_Mapped model buffer size =   259.69 MiB
0.00.600.300 I load_tensors:        CUDA0 model buffer size =   682.64 MiB
0.00.610.000 I llama_context: n_ctx                 = 32768
0.00.610.001 I llama_context: n_ctx_seq             = 16384
0.00.610.100 I llama_context:  CUDA_Host  output buffer size =     1.16 MiB
0.00.610.200 I llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB
0.00.610.300 I llama_kv_cache:      CUDA0 KV buffer size =   128.00 MiB
0.00.650.000 I sched_reserve:      CUDA0 compute buffer size =   298.50 MiB
0.00.650.100 I sched_reserve:  CUDA_Host compute buffer size =    65.76 MiB
"""


def test_parse_buffers_sums_per_device_and_kind() -> None:
    buffers = parsing.parse_buffers(REPLICA_LOG)
    assert buffers == {
        "CPU_Mapped": {"model": 259.69},
        "CUDA0": {"model": 682.64, "KV": 384.0, "compute": 298.5},
        "CUDA_Host": {"output": 1.16, "compute": 65.76},
    }
    assert parsing.device_sums(buffers, dry_run=False) == {"model": 682.64, "KV": 384.0, "compute": 298.5}
    assert parsing.device_sums(buffers, dry_run=True) == {"model": 259.69}
    assert parsing.host_weights(buffers) == 259.69
    assert parsing.context_lines(REPLICA_LOG) == [
        "0.00.610.000 I llama_context: n_ctx = 32768",
        "0.00.610.001 I llama_context: n_ctx_seq = 16384",
    ]
    assert parsing.parse_buffers("--- 2026-01-01 10:00:00 replica 3 of other\n") == {}


def test_parse_nvidia_smi() -> None:
    csv = "0, NVIDIA H200, 00000000:19:00.0, 143771, 1024\n1, NVIDIA H200, 00000000:3B:00.0, 143771, [N/A]\n"
    first, second = parsing.parse_gpus(csv)
    assert first == {
        "index": 0,
        "name": "NVIDIA H200",
        "bus_id": "00000000:19:00.0",
        "total_mib": 143771,
        "used_mib": 1024,
    }
    assert second["index"] == 1 and second["used_mib"] is None
    assert parsing.parse_compute_apps("4242, 1718\n4343, [N/A]\n\nNo running processes found\n") == {
        4242: 1718,
        4343: None,
    }


def _plan_model() -> dict[str, object]:
    return {
        "name": "qwen-shape",
        "verdict": "fits",
        "ctx": 32768,
        "ctx_per_slot": 16384,
        "parallel": 2,
        "need_by_gpu": {"0": 1900 * MiB},
        "host_bytes": 260 * MiB,
        "devices": [
            {
                "device": 0,
                "weights_bytes": 680 * MiB,
                "kv_bytes": 384 * MiB,
                "recurrent_bytes": 0,
                "compute_bytes": 300 * MiB,
                "reserve_bytes": 512 * MiB,
                "total_bytes": 1876 * MiB,
            }
        ],
    }


def test_compare_replica_on_a_gpu() -> None:
    buffers = parsing.parse_buffers(REPLICA_LOG)
    row = compare.compare_replica(
        _plan_model(), {"id": 1, "pid": 4242}, buffers, dry_run=False, process_mib=1718, gpu_delta_mib=1722
    )
    assert row["predicted_mib"] == {
        "weights": 680.0,
        "kv": 384.0,
        "compute": 300.0,
        "reserve": 512.0,
        "total": 1876.0,
        "need": 1900.0,
        "host": 260.0,
        "buffers": 1364.0,
    }
    assert row["logged_mib"] == {
        "weights": 682.64,
        "kv": 384.0,
        "compute": 298.5,
        "buffers": 1365.14,
        "host": 259.69,
    }
    assert row["buffers_error_pct"] == pytest.approx(-0.08, abs=0.01)
    assert row["measured_mib"] == 1718  # the process reading wins over the GPU's rise
    assert row["outside_buffers_mib"] == pytest.approx(1718 - 1365.14)
    assert row["need_minus_measured_mib"] == 182.0
    assert row["need_covers_measured"] is True
    # Without a per-process reading (a container hiding pids) the rise of the GPU's used memory counts.
    row = compare.compare_replica(
        _plan_model(), {"id": 1, "pid": 4242}, buffers, dry_run=False, process_mib=None, gpu_delta_mib=1950
    )
    assert row["measured_mib"] == 1950 and row["need_covers_measured"] is False


def test_checks_of_a_gpu_run() -> None:
    buffers = parsing.parse_buffers(REPLICA_LOG)
    row = compare.compare_replica(
        _plan_model(), {"id": 1, "pid": 4242}, buffers, dry_run=False, process_mib=1718, gpu_delta_mib=None
    )
    reload = {"status": 200, "restarted": [], "ctx": {"qwen-shape": {"before": 32768, "after": 32768}}}
    document = {"mode": "gpu", "replicas": [row], "reload": reload}
    assert [(c["check"], c["ok"]) for c in compare.checks_of(document)] == [
        ("reload keeps contexts", True),
        ("qwen-shape: CUDA0 buffers logged", True),
        ("qwen-shape: need covers measured", True),
    ]
    reload["ctx"]["qwen-shape"]["after"] = 16384
    assert not compare.checks_of(document)[0]["ok"]


def test_refuses_without_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, no nvcc
    output = tmp_path / "out.json"
    assert gc.main(["--output", str(output), "--models-dir", str(tmp_path)]) == 2
    assert "cannot run here: nvidia-smi is not on PATH" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.real
def test_cpu_dry_run_end_to_end(tmp_path: Path) -> None:
    binary = require_llama_server()
    require_vocab_dir("llama-spm")
    output = tmp_path / "gpu-calibration.json"
    argv = [str(SCRIPT), "--cpu-dry-run", "--small-models", "--llama-server", str(binary)]
    argv += ["--models-dir", str(tmp_path / "models"), "--output", str(output)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "### Buffers on GPU 0" in done.stdout and "all checks passed" in done.stdout
    document = json.loads(output.read_text())
    assert document["mode"] == "cpu-dry-run" and document["ok"] is True
    rows = {row["model"]: row for row in document["replicas"]}
    assert set(rows) == {"qwen-shape", "llama-shape"}
    for row in rows.values():
        assert row["logged_mib"]["kv"] == pytest.approx(row["predicted_mib"]["kv"], rel=0.02)
        assert row["logged_context"], "llama-server's n_ctx lines are missing from the replica's log"
        assert row["nvidia_smi_process_mib"] is None
    assert rows["llama-shape"]["ctx"] == 4096  # the operator's ctx
    assert rows["qwen-shape"]["parallel"] == 2
    assert all(c["before"] == c["after"] for c in document["reload"]["ctx"].values())
