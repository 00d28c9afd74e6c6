"""bench_ceiling.py runs end to end in its short form: a synthetic replica on a port of its own and a router
whose replicas are synthetic, a few streams through each; it writes its JSON with every figure it reports.
Nothing here is timed: the figures are the benchmark's to judge."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import bench_ceiling, results

POINT_KEYS = {"streams", "rate", "offered", "tokens", "direct", "router", "added"}
TARGET_KEYS = {
    "complete",
    "failures",
    "chunks",
    "rate_per_stream",
    "rate_loss_pct",
    "gap_ms",
    "ttft_ms",
    "relay_cpu_s_per_1000",
    "replica_cpu_s_per_1000",
    "generator_cpu_s_per_1000",
    "generator_cpu_share",
    "machine_busy_share",
    "rss_per_stream_bytes",
}


def test_the_short_run_writes_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(results, "OUTPUTS", tmp_path)
    monkeypatch.setenv("SYNTHETIC_PYTHON", sys.executable)
    assert bench_ceiling.main(["--small", "--name", "ceiling-smoke"]) == 0
    document = json.loads((tmp_path / "benchmark-ceiling-smoke.json").read_text())
    assert {"settings", "machine", "setup", "result"} <= set(document)
    result = document["result"]
    assert {"idle", "points", "ceiling", "goals"} <= set(result)
    (point,) = result["points"]
    assert set(point) >= POINT_KEYS
    for target in ("direct", "router"):
        assert set(point[target]) >= TARGET_KEYS
        assert point[target]["complete"] == point[target]["streams"] == 2, point[target]["errors"]
        assert point[target]["chunks"] == 2 * point["tokens"]
    assert point["router"]["relay_cpu_s"] is not None and point["direct"]["relay_cpu_s"] is None
    assert [g["verdict"] for g in result["goals"]] != [] and "Goals" in capsys.readouterr().out
