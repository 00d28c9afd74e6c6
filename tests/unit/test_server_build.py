"""The llama-server build: read from the binary's --version once (cached per binary), refused at startup
(exit 2, one line naming the binary, its build and the minimum) when the binary lacks a flag the router
passes to its replicas, and reported by --version, /health and /status."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from router.config.load import config_from_dict
from router.deploy.deployment import prepare
from router.hosts import server_build, server_flags
from router.hosts.server_build import (
    LlamaServerTooOld,
    ServerBuild,
    check_router_flags,
    known_build,
    parse_version,
    read_build,
)
from router.hosts.server_flags import parse_help
from router.shell.reload import check_llama_servers, router_flags
from tests.support import REPO
from tests.support.harness import running_router
from tests.support.simconfig import config_document, write_config

HELP_FIXTURE = Path(__file__).resolve().parents[1] / "support" / "llama-server-help.txt"
HOME_ENV = "LLAMA_ROUTER_HOME"
OLD_VERSION = "version: 9000 (deadbee)\nbuilt with cc (GCC) 12.2.0 for x86_64-linux-gnu\n"


def _version() -> str:
    with (REPO / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def _refusal(binary: Path, flag: str, who: str = "every replica", build: str = "build 9000") -> str:
    return (
        f"llama-server {binary} ({build}) lacks {flag}, which llama-router passes to {who}; llama-router "
        "needs llama.cpp build b11434 or newer: update llama.cpp or point [router] llama_server at a newer "
        "binary"
    )


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readings go to this test's directory, and nothing is remembered from other tests."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(server_flags, "_memo", {})
    monkeypatch.setattr(server_build, "_memo", {})
    monkeypatch.setattr(server_build, "_last", {})


def help_without(*flags: str) -> str:
    """b11434's --help with the option lines that hold any of ``flags`` left out."""
    lines = HELP_FIXTURE.read_text().splitlines()
    kept = [line for line in lines if not set(flags) & set(line.replace(",", " ").split())]
    text = "\n".join(kept) + "\n"
    assert not set(flags) & parse_help(text) and "--port" in parse_help(text)
    return text


def old_binary(dir: Path, help_text: str, version_text: str = OLD_VERSION) -> tuple[Path, Path]:
    """A llama-server stand-in: ``help_text`` for --help, ``version_text`` (on stderr) for --version, the
    usage error of llama-server for anything else; every run is counted in the second path."""
    dir.mkdir(parents=True, exist_ok=True)
    runs = dir / "runs"
    (dir / "help.txt").write_text(help_text)
    (dir / "version.txt").write_text(version_text)
    binary = dir / "llama-server"
    binary.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{runs}"\n'
        'case "$1" in\n'
        f'  --help) cat "{dir / "help.txt"}" ;;\n'
        f'  --version) cat "{dir / "version.txt"}" >&2 ;;\n'
        '  *) echo "error: invalid argument: $1" >&2; exit 1 ;;\n'
        "esac\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary, runs


def _runs(runs: Path, flag: str) -> int:
    return runs.read_text().splitlines().count(flag) if runs.exists() else 0


def _router(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, HOME_ENV: str(home), "PYTHONPATH": str(REPO)},
        timeout=60,
        check=False,
    )


# ------------------------------------------------------------------------------------------------ reading


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "load_backend: loaded CPU\nversion: 0.6.0 (build 11434, commit abcdef0)\nbuilt with GNU\n",
            ServerBuild(11434, "abcdef0", "0.6.0"),
        ),
        ("version: 0.6.0-dev (build 11434, commit unknown)\n", ServerBuild(11434, None, "0.6.0-dev")),
        ("version: 0.6.0 (build 0, commit unknown)\n", ServerBuild(None, None, "0.6.0")),
        (OLD_VERSION, ServerBuild(9000, "deadbee")),
        ("usage: something else\n", ServerBuild()),
        ("", ServerBuild()),
    ],
)
def test_the_version_line_of_new_and_old_builds(text: str, expected: ServerBuild) -> None:
    assert parse_version(text) == expected


def test_the_build_is_read_once_per_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary, runs = old_binary(tmp_path / "bin", HELP_FIXTURE.read_text())
    assert known_build(binary) is None  # nothing read yet, and asking runs nothing
    assert read_build(binary) == ServerBuild(9000, "deadbee")
    assert known_build(binary) == ServerBuild(9000, "deadbee")
    (cache,) = (tmp_path / "home").glob("build-*.json")
    assert json.loads(cache.read_text())["binary"] == str(binary)
    assert read_build(binary).number == 9000  # remembered in this process
    monkeypatch.setattr(server_build, "_memo", {})
    assert read_build(binary).number == 9000  # read from the cache file
    assert _runs(runs, "--version") == 1
    monkeypatch.setattr(server_build, "_memo", {})
    (tmp_path / "bin" / "version.txt").write_text("version: 0.6.0 (build 11500, commit 0123abc)\n")
    stamp = binary.stat().st_mtime_ns + 5_000_000_000
    os.utime(binary, ns=(stamp, stamp))  # a rebuilt binary is asked again
    assert read_build(binary) == ServerBuild(11500, "0123abc", "0.6.0")
    assert known_build(binary) == ServerBuild(11500, "0123abc", "0.6.0")
    assert _runs(runs, "--version") == 2


# -------------------------------------------------------------------------------------------------- check


def test_a_binary_without_a_flag_every_replica_gets_is_refused_in_one_line(tmp_path: Path) -> None:
    binary, _ = old_binary(tmp_path / "bin", help_without("--fit"))
    with pytest.raises(LlamaServerTooOld) as info:
        check_router_flags(binary, {"a": ("--port", "--fit"), "b": ("--port", "--fit")})
    assert str(info.value) == _refusal(binary, "--fit")


def test_a_flag_only_some_models_get_names_them(tmp_path: Path) -> None:
    binary, _ = old_binary(tmp_path / "bin", help_without("--rpc"))
    with pytest.raises(LlamaServerTooOld) as info:
        check_router_flags(binary, {"local": ("--port",), "remote": ("--port", "--rpc")})
    assert str(info.value) == _refusal(binary, "--rpc", "the replicas of models.remote")


def test_a_binary_with_every_flag_passes_and_its_build_is_known(tmp_path: Path) -> None:
    binary, _ = old_binary(
        tmp_path / "bin", HELP_FIXTURE.read_text(), "version: sim (build 11434, commit x)\n"
    )
    assert check_router_flags(binary, {"a": ("--port", "--fit", "--cache-ram")}) == ServerBuild(
        11434, "x", "sim"
    )
    assert known_build(binary) == ServerBuild(11434, "x", "sim")


def test_a_help_without_a_flag_list_is_not_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Today's behaviour: such a binary is used unchecked, with one warning, and --version is not run."""
    binary, runs = old_binary(tmp_path / "bin", "usage: something else\n")
    with caplog.at_level(logging.WARNING, logger="router"):
        assert check_router_flags(binary, {"a": ("--port", "--fit")}) is None
    assert any("printed no llama-server flag list" in r.getMessage() for r in caplog.records)
    assert _runs(runs, "--help") == 1 and _runs(runs, "--version") == 0


def _deployment_config(tmp_path: Path, binary: Path, models: dict[str, Any], **extra: Any) -> Any:
    doc = config_document(tmp_path, models, router={"llama_server": str(binary), "num_gpus": 1}, **extra)
    return config_from_dict(doc, tmp_path / "router.json")


def test_the_router_flags_of_a_launch_leave_the_pass_through_flags_out(tmp_path: Path) -> None:
    binary, _ = old_binary(tmp_path / "bin", HELP_FIXTURE.read_text())
    models = {"a": {"gpus": [], "threads": 2, "sim": {}}}
    deployment = prepare(_deployment_config(tmp_path, binary, models, defaults={"metrics": True}))
    flags = router_flags(deployment.launches["a"])
    assert set(flags) >= {"--host", "--port", "-m", "-c", "-np", "-ngl", "--fit", "--cache-ram", "--alias"}
    assert "--threads" not in flags and "--metrics" not in flags
    assert "--threads" in deployment.launches["a"].argv(0)  # the replica still gets them


def test_a_deployment_whose_binary_lacks_rpc_is_refused_naming_the_rpc_models(tmp_path: Path) -> None:
    binary, _ = old_binary(tmp_path / "bin", help_without("--rpc"))
    models = {"local": {"gpus": [0], "sim": {}}, "remote": {"gpus": [], "rpc": ["box"], "sim": {}}}
    rpc = {"box": {"endpoint": "127.0.0.1:50052", "memory_mib": 1024}}
    deployment = prepare(_deployment_config(tmp_path, binary, models, rpc_devices=rpc))
    with pytest.raises(LlamaServerTooOld) as info:
        check_llama_servers(deployment)
    assert str(info.value) == _refusal(binary, "--rpc", "the replicas of models.remote")
    # Without the RPC model the same binary is fine: the router passes it no --rpc.
    deployment = prepare(_deployment_config(tmp_path, binary, {"local": {"gpus": [0], "sim": {}}}))
    check_llama_servers(deployment)


# -------------------------------------------------------------------------------------- the command line


def test_startup_refuses_a_binary_without_fit_in_one_line(tmp_path: Path) -> None:
    binary, runs = old_binary(tmp_path / "bin", help_without("--fit"))
    doc = config_document(
        tmp_path, {"a": {"sim": {}}, "b": {"sim": {}}}, router={"llama_server": str(binary)}
    )
    path = write_config(tmp_path, doc)
    # (placement warns that the simulator's model files are no GGUF files: only errors are shown here)
    done = _router("--config", str(path), "--log-level", "ERROR", home=tmp_path / "home")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [_refusal(binary, "--fit")]
    assert _runs(runs, "--help") == 1 and _runs(runs, "--version") == 1  # no replica was started


def test_version_names_the_router_and_the_configured_binary_with_its_build(tmp_path: Path) -> None:
    binary, _ = old_binary(tmp_path / "bin", help_without("--fit"))
    doc = config_document(tmp_path, {"a": {"sim": {}}}, router={"llama_server": str(binary)})
    path = write_config(tmp_path, doc)
    done = _router("--version", "--config", str(path), home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"llama-router {_version()}\n"
        f"llama-server {binary} (build 9000, commit deadbee; llama-router needs build b11434 or newer)\n"
    )
    doc["router"]["llama_server"] = str(tmp_path / "missing")
    write_config(tmp_path, doc)
    done = _router("--version", "--config", str(path), home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.splitlines()[1]
        == f"llama-server: {str(tmp_path / 'missing')!r} is missing or not an executable file"
    )


# ------------------------------------------------------------------------------------------ /health /status


async def test_health_and_status_report_the_versions(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": {}}, "b": {"sim": {}}}) as rt:
        sim = str(tmp_path / "sim-llama-server")
        health = await rt.client.get("/health")
        assert health.status_code == 200
        assert health.json() == {
            "status": "ok",
            "version": _version(),
            "llama_server": [{"build": 11434, "commit": "b0-sim"}],
        }
        status = await rt.status()
        assert status["version"] == _version()
        assert status["llama_server"] == [
            {"path": sim, "build": 11434, "commit": "b0-sim", "models": ["a", "b"]}
        ]
