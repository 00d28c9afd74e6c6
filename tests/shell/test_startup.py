"""The first start: --version, a taken port, a missing model file, the history database of each router, and
`plan`'s exit status. Startup failures are one message and exit status 2, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from router.__main__ import main
from router.config.load import default_history_db, load_config
from tests.support import REPO
from tests.support.client import assert_openai_error, post_chat
from tests.support.harness import running_router
from tests.support.simconfig import config_document, write_config


def run_router(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "router", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


def assert_one_line_failure(done: subprocess.CompletedProcess[str], status: int = 2) -> str:
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------------- version


def test_version_prints_the_package_version() -> None:
    with (REPO / "pyproject.toml").open("rb") as file:
        version = tomllib.load(file)["project"]["version"]
    done = run_router("--version")
    assert done.returncode == 0, done.stderr
    # The second line names the llama-server found and its build (tests/unit/test_server_build.py).
    first, second = done.stdout.splitlines()
    assert first == f"llama-router {version}"
    assert second.startswith("llama-server")


def test_the_installed_command_has_the_version_too(capsys: pytest.CaptureFixture[str]) -> None:
    with (REPO / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    assert project["scripts"]["llama-router"] == "router.__main__:main"
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.splitlines()[0] == f"llama-router {project['version']}"


# ------------------------------------------------------------------------------------------------------- port


def test_a_taken_port_is_one_line_naming_the_address_and_the_setting(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        doc = config_document(tmp_path, {"a": {"sim": {}}}, port=port)
        line = assert_one_line_failure(run_router("--config", str(write_config(tmp_path, doc))))
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in line
    assert "`port` in [router] (or ROUTER_PORT)" in line and "`host`" in line
    assert not (tmp_path / "records").exists()  # nothing was started


# ------------------------------------------------------------------------------------------------ model files


def test_a_missing_model_file_stops_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "gone.gguf"
    doc = config_document(tmp_path, {"a": {"model": str(missing)}})
    line = assert_one_line_failure(run_router("--config", str(write_config(tmp_path, doc))))
    assert f'models.a.model = "{missing}" is invalid: the model file {missing} cannot be read' in line
    assert "No such file or directory" in line


def _edit(dir: Path, change: Any) -> None:
    path = dir / "router.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


async def test_reload_refuses_a_missing_or_unreadable_model_file(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": {"tokens": 2}}}) as rt:
        gone = tmp_path / "gone.gguf"
        _edit(rt.dir, lambda doc: doc["models"]["a"].update(model=str(gone)))
        error = assert_openai_error(await rt.client.post("/reload", json={}), 400, "invalid_config")
        assert f"the model file {gone} cannot be read (No such file or directory)" in error["message"]
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200

        folder = tmp_path / "a-directory.gguf"
        folder.mkdir()
        _edit(rt.dir, lambda doc: doc["models"]["a"].update(model=str(folder)))
        error = assert_openai_error(await rt.client.post("/reload", json={}), 400, "invalid_config")
        assert f"the model file {folder} cannot be read (it is a directory)" in error["message"]
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200


# ---------------------------------------------------------------------------------------------------- history


def test_routers_on_different_config_files_get_different_history_databases(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    paths = []
    for where in ("one/router.toml", "two/router.toml", "one/other.toml"):
        path = tmp_path / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('[models.a]\nmodel = "a.gguf"\n')
        paths.append(load_config(path, env=env).router.history_db)
    assert len(set(paths)) == 3
    assert all(
        p.parent.parent == tmp_path / "state" / "llama-router" and p.name == "history.db" for p in paths
    )
    assert paths[0].parent.name.startswith("router-") and paths[2].parent.name.startswith("other-")
    again = load_config(tmp_path / "one" / "router.toml", env=env).router.history_db
    assert again == paths[0]  # the same file keeps its database
    relative = default_history_db(Path(os.path.relpath(tmp_path / "one" / "router.toml")), env)
    assert relative == paths[0]


async def test_a_second_router_on_the_same_history_database_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "history.db"
    async with running_router(tmp_path / "first", {"a": {"sim": {}}}, router={"history_db": str(shared)}):
        second = tmp_path / "second"
        doc = config_document(second, {"b": {"sim": {}}}, router={"history_db": str(shared)})
        line = assert_one_line_failure(run_router("--config", str(write_config(second, doc))))
        assert f'router.history_db = "{shared}" is in use: another llama-router (pid {os.getpid()})' in line
        assert "`history_db` in [router] or the HISTORY_DB_PATH environment variable" in line
        assert not (second / "records").exists()  # refused before any replica started

    # Once the first router has stopped, the database is free again.
    async with running_router(second, {"b": {"sim": {}}}, router={"history_db": str(shared)}) as rt:
        assert (await post_chat(rt.client, "b", max_tokens=2)).status_code == 200


# ------------------------------------------------------------------------------------------------------- plan


def test_plan_exits_1_when_a_model_is_refused_or_unreadable(tmp_path: Path) -> None:
    doc = config_document(tmp_path, {"a": {"sim": {}}})  # a simulated model is no GGUF: verdict "error"
    done = run_router("plan", "--config", str(write_config(tmp_path, doc)))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "error" in done.stdout
