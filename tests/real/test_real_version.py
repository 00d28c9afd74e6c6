"""The real llama-server of the release CI installs (b11434, the oldest build the router supports) takes every
flag the router passes (the router starts on it and a replica answers), and --version, /health and /status
report its build."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from router.hosts.locate import LLAMA_CPP_RELEASE, MINIMUM_LLAMA_CPP_BUILD
from tests.support import REPO
from tests.support.client import post_chat
from tests.support.realenv import BINARY_ENV, require_llama_server
from tests.support.realharness import real_document, real_router
from tests.support.simconfig import write_config


def _version() -> str:
    with (REPO / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def _assert_build(number: object) -> None:
    """The installed release exactly; a binary named by LLAMA_ROUTER_LLAMA_SERVER (a GPU build, say) at least
    the minimum."""
    assert isinstance(number, int), number
    if os.environ.get(BINARY_ENV):
        assert number >= MINIMUM_LLAMA_CPP_BUILD
    else:
        assert number == int(LLAMA_CPP_RELEASE)


def test_version_names_the_real_binary_and_its_build(tmp_path: Path) -> None:
    binary = require_llama_server()
    path = write_config(tmp_path, real_document(tmp_path, {"a": {}}))
    done = subprocess.run(
        [sys.executable, "-m", "router", "--version", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == f"llama-router {_version()}"
    found = re.fullmatch(
        rf"llama-server {re.escape(str(binary))} \(build (\d+)(, commit [0-9a-f]+)?\)", second
    )
    assert found is not None, second
    _assert_build(int(found.group(1)))


async def test_health_and_status_report_the_real_build(tmp_path: Path) -> None:
    binary = require_llama_server()
    async with real_router(tmp_path, {"a": {}}) as rt:
        health = (await rt.client.get("/health")).json()
        assert health["status"] == "ok" and health["version"] == _version()
        (entry,) = health["llama_server"]
        _assert_build(entry["build"])
        status = await rt.status()
        assert status["version"] == _version()
        assert status["llama_server"] == [{"path": str(binary), **entry, "models": ["a"]}]
        # The router started on this binary, so it takes every flag the router passes; a replica proves it.
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200
