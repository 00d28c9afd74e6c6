"""Each command imports what it uses: ``plan``, ``init``, ``import-config``, ``--version`` and ``make-model``
load no HTTP stack (hypercorn, quart, quart-trio, httpx, trio, prometheus_client) and none of the layers
that serve requests, and the first four stay under 30 MiB of peak memory (the interpreter alone takes about
10 MiB, reading configuration and GGUF headers about 15 more).

Each command runs in a fresh interpreter, as ``python -m router`` would run it, through a wrapper that
records ``sys.modules`` and the process's peak resident set size at exit. The peak is the kernel's VmHWM,
the high-water mark of the process's own memory since it started the interpreter: ``ru_maxrss`` would not
do, Linux carries it over from the process that spawned the child (pytest, 60 MiB and more).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from router.placement.synthetic import SyntheticModel, write_header_only
from tests.support import REPO
from tests.support.original_config import write_original_pair
from tests.support.realenv import require_vocab_dir

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="peak memory is read from /proc/self/status (Linux)"
)

LIMIT_MIB = 30
# make-model generates its weights with numpy's random generator and writes them with the gguf package:
# importing those two takes ~36 MiB before any work, and the default model's 32000 x 64 f32 embedding
# matrix 8 MiB more (it writes one tensor at a time; 128 MiB when it held them all).
MAKE_MODEL_LIMIT_MIB = 64

HTTP_STACK = ("hypercorn", "quart", "quart_trio", "httpx", "trio", "prometheus_client", "h11", "h2")
SERVING_LAYERS = ("router.journal", "router.shell", "router.observe", "router.http", "router.serve")
# The header reader loads gguf's constants on its own, without the package (and numpy).
WEIGHTS = ("numpy", "gguf")

PROBE = """
import atexit, json, runpy, sys

report, sys.argv = sys.argv[1], ["python -m router", *sys.argv[2:]]


@atexit.register
def _report():
    with open("/proc/self/status") as status:
        peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(report, "w") as f:
        json.dump({"modules": sorted(sys.modules), "peak_kib": peak_kib}, f)


runpy.run_module("router", run_name="__main__", alter_sys=True)
"""


def run_command(tmp_path: Path, args: Sequence[str]) -> dict[str, Any]:
    """Run ``python -m router ARGS`` in a fresh interpreter; its modules at exit and peak RSS in MiB."""
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUTER_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.exists(), done.stderr
    result: dict[str, Any] = json.loads(report.read_text())
    result["returncode"] = done.returncode
    result["stderr"] = done.stderr
    result["peak_mib"] = result["peak_kib"] / 1024
    return result


def loaded(modules: Sequence[str], packages: Sequence[str]) -> list[str]:
    """The packages of ``packages`` that have a module in ``modules``."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder with one small header-only model, a configuration serving it, and an original config.json."""
    root = tmp_path_factory.mktemp("commands")
    models = root / "models"
    models.mkdir()
    model = models / "tiny.gguf"
    write_header_only(model, SyntheticModel(n_vocab=32000))
    config = root / "router.toml"
    config.write_text(f'[models.tiny]\nmodel = "{model}"\nctx = 2048\n')
    (root / "original").mkdir()
    original, _ = write_original_pair(
        root / "original", dict.fromkeys(("chat-small", "coder", "embedder"), str(model))
    )
    return {"root": root, "models": models, "config": config, "original": original}


LIGHT_COMMANDS = {
    "plan": lambda w: ["plan", "--config", str(w["config"])],
    "plan-json-models-dir": lambda w: ["--models-dir", str(w["models"]), "plan", "--json"],
    "init": lambda w: ["init", "--models-dir", str(w["models"])],
    "import-config": lambda w: ["import-config", str(w["original"])],
    "version": lambda w: ["--version", "--config", str(w["config"])],
}


@pytest.mark.parametrize("name", list(LIGHT_COMMANDS))
def test_light_commands_load_no_server_and_stay_small(
    name: str, world: dict[str, Path], tmp_path: Path
) -> None:
    result = run_command(tmp_path, LIGHT_COMMANDS[name](world))
    assert result["returncode"] == 0, result["stderr"]
    modules = result["modules"]
    assert loaded(modules, HTTP_STACK + SERVING_LAYERS + WEIGHTS) == []
    assert result["peak_mib"] < LIMIT_MIB, f"{name} peaked at {result['peak_mib']:.1f} MiB"


def test_make_model_loads_no_server(tmp_path: Path) -> None:
    vocab_dir = require_vocab_dir()
    out = tmp_path / "tiny.gguf"
    result = run_command(tmp_path, ["make-model", str(out), "--vocab-dir", str(vocab_dir)])
    assert result["returncode"] == 0, result["stderr"]
    assert out.is_file()
    assert loaded(result["modules"], HTTP_STACK + SERVING_LAYERS) == []
    assert result["peak_mib"] < MAKE_MODEL_LIMIT_MIB, f"make-model peaked at {result['peak_mib']:.1f} MiB"


def test_the_probe_sees_the_server_stack_where_it_is_loaded(tmp_path: Path) -> None:
    """Running the router (here without a configuration, so it stops at once) loads the stack: the probe is
    not blind to it."""
    result = run_command(tmp_path, [])
    assert result["returncode"] == 2
    assert "no configuration" in result["stderr"]
    assert loaded(result["modules"], HTTP_STACK) == list(HTTP_STACK)
    assert loaded(result["modules"], SERVING_LAYERS) == list(SERVING_LAYERS)
