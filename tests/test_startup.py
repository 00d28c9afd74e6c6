"""The first start: a missing model file stops it, and a reload to one is refused. Startup failures are one
message and exit status 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import (
    REPO,
    assert_openai_error,
    config_document,
    post_chat,
    running_router,
    write_config,
)


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
