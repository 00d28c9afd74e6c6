"""The NixOS module evaluated without nixpkgs: tests/docs/module_stub.nix stands in for lib and pkgs, and
``evaluate_module`` returns the option names, the service's settings and the rendered configuration."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO

ROOT = REPO
STUB = ROOT / "tests" / "docs" / "module_stub.nix"
LLAMA_SERVER = "/nix/store/stub-llama-cpp/bin/llama-server"


def nix_eval(tmp_path: Path, expression: str, values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate is not installed (Debian package nix-bin)")
    data = tmp_path / "values.json"
    data.write_text(json.dumps(values))
    expr = expression.replace("VALUES", f"(builtins.fromJSON (builtins.readFile {data}))")
    return subprocess.run(
        [nix, "--eval", "--strict", "--json", "-E", expr], capture_output=True, text=True, check=False
    )


def evaluate_module(tmp_path: Path, values: dict[str, Any]) -> dict[str, Any]:
    expr = f"import {STUB} {{ module = {ROOT / 'nix' / 'module.nix'}; values = VALUES; }}"
    result = nix_eval(tmp_path, expr, values)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    prefix = "/nix/store/stub-llama-router/bin/llama-router --config toml:"
    assert doc["execStart"].startswith(prefix), doc["execStart"]
    doc["config"] = json.loads(doc["execStart"].removeprefix(prefix))
    return doc
