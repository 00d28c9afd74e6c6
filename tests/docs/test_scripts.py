"""The shell scripts: they parse, and the virtualenv helper that scripts/demo and scripts/test source makes
and fills .venv only when no virtualenv is active (checked with a stand-in python3, no network)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "scripts" / "lib" / "venv.sh"
SCRIPTS = [
    REPO / "scripts" / "demo",
    REPO / "scripts" / "test",
    REPO / "scripts" / "install-llama-server",
    REPO / "scripts" / "lib" / "venv.sh",
    REPO / ".ci" / "run",
]

# A stand-in for python3: `-m venv DIR` makes DIR/bin/python (another stand-in), `-c CODE` succeeds unless
# FAKE_FAIL_IMPORT occurs in CODE; every call is logged to $FAKE_LOG.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$0 $*" >> "$FAKE_LOG"
if [[ "$1" == "-m" && "$2" == "venv" ]]; then
    mkdir -p "$3/bin"
    cp "$0" "$3/bin/python"
    exit 0
fi
if [[ "$1" == "-c" && -n "${FAKE_FAIL_IMPORT:-}" && "$2" == *"$FAKE_FAIL_IMPORT"* ]]; then
    exit 1
fi
exit 0
"""


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_scripts_parse(script: Path) -> None:
    assert script.is_file()
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_demo_and_test_share_the_helper() -> None:
    for name in ("demo", "test"):
        text = (REPO / "scripts" / name).read_text()
        assert "source scripts/lib/venv.sh" in text and "use_project_venv" in text
        assert "pip install" not in text
    assert "pip install" not in (REPO / ".ci" / "run").read_text()
    assert "scripts/test" in (REPO / ".ci" / "run").read_text()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return root


def run_helper(
    project: Path, extra: str = "test", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    fake_bin = project.parent / "bin"
    script = (
        f'source "{HELPER}"\n'
        f'use_project_venv "{project}" "{extra}" json\n'
        'echo "VIRTUAL_ENV=${VIRTUAL_ENV:-}"\n'
        'echo "PATH=${PATH}"\n'
    )
    full_env = {
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(project.parent),
        "FAKE_LOG": str(project.parent / "calls.log"),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{script}", "scripts/test"],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
    )


def calls(project: Path) -> list[str]:
    log = project.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def pip_installs(project: Path) -> list[str]:
    return [line for line in calls(project) if "-m pip install" in line]


def test_inside_a_virtualenv_nothing_is_created(project: Path, tmp_path: Path) -> None:
    active = tmp_path / "active-venv"
    done = run_helper(project, env={"VIRTUAL_ENV": str(active)})
    assert done.returncode == 0, done.stderr
    assert not (project / ".venv").exists()
    assert f"VIRTUAL_ENV={active}" in done.stdout
    assert pip_installs(project) == []  # everything imports: no install


def test_inside_a_virtualenv_a_missing_module_installs_there(project: Path, tmp_path: Path) -> None:
    done = run_helper(project, env={"VIRTUAL_ENV": str(tmp_path / "v"), "FAKE_FAIL_IMPORT": "json"})
    assert done.returncode == 0, done.stderr
    assert not (project / ".venv").exists()
    (install,) = pip_installs(project)
    assert install.startswith(str(project.parent / "bin" / "python3"))
    assert install.endswith(f"-m pip install -q -e {project}[test]")


def test_outside_a_virtualenv_the_project_venv_is_made_and_filled_once(project: Path) -> None:
    venv = project / ".venv"
    done = run_helper(project)
    assert done.returncode == 0, done.stderr
    assert (venv / "bin" / "python").exists()
    assert f"VIRTUAL_ENV={venv}" in done.stdout
    assert f"PATH={venv / 'bin'}{os.pathsep}" in done.stdout
    (install,) = pip_installs(project)
    assert install == f"{venv / 'bin' / 'python'} -m pip install -q -e {project}[test]"

    assert run_helper(project).returncode == 0
    assert len(pip_installs(project)) == 1  # the marker says it is installed
    assert run_helper(project, extra="").returncode == 0
    assert len(pip_installs(project)) == 1  # the test extras include the package itself

    marker = venv / ".llama-router-installed-test"
    os.utime(marker, (1_000_000_000, 1_000_000_000))  # pyproject.toml is now newer
    assert run_helper(project).returncode == 0
    assert len(pip_installs(project)) == 2


def test_without_venv_support_one_line_says_what_to_install(project: Path) -> None:
    done = run_helper(project, env={"FAKE_FAIL_IMPORT": "ensurepip"})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "apt-get install python3-venv" in lines[0] and lines[0].startswith("test: ")
    assert not (project / ".venv").exists()


def test_python3_can_make_a_virtualenv_here(tmp_path: Path) -> None:
    """The real thing, without network: the interpreter running the tests can create a venv with pip."""
    python = shutil.which("python3")
    if python is None:
        pytest.skip("no python3 on PATH")
    venv = tmp_path / "v"
    command = [python, "-m", "venv", "--without-pip", str(venv)]
    done = subprocess.run(command, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (venv / "bin" / "python").exists()
