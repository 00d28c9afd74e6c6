"""Lookup order of the llama-server binary: configured path, PATH, then the install location."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from router.hosts import locate
from router.hosts.locate import LlamaServerNotFound, find_llama_server


def make_executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An isolated world: an empty PATH directory, an empty router home, a home directory."""
    dirs = {name: tmp_path / name for name in ("path", "router-home", "home", "xdg")}
    for d in dirs.values():
        d.mkdir()
    monkeypatch.setenv("PATH", str(dirs["path"]))
    monkeypatch.setenv("LLAMA_ROUTER_HOME", str(dirs["router-home"]))
    monkeypatch.setenv("HOME", str(dirs["home"]))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return dirs


def installed(home: Path) -> Path:
    return make_executable(home / "llama.cpp-11434" / "bin" / "llama-server")


def test_install_locations_follow_router_home(env: dict[str, Path]) -> None:
    home = env["router-home"]
    assert locate.install_dir() == home / "llama.cpp-11434"
    assert locate.cached_llama_server() == home / "llama.cpp-11434" / "bin" / "llama-server"
    assert locate.vocab_dir() == home / "llama.cpp-11434" / "vocab"


def test_router_home_falls_back_to_xdg_cache_then_home(
    env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLAMA_ROUTER_HOME")
    assert locate.router_home() == env["home"] / ".cache" / "llama-router"
    monkeypatch.setenv("XDG_CACHE_HOME", str(env["xdg"]))
    assert locate.router_home() == env["xdg"] / "llama-router"
    assert (
        locate.cached_llama_server()
        == env["xdg"] / "llama-router" / "llama.cpp-11434" / "bin" / "llama-server"
    )


def test_configured_path_wins_over_path_and_install(env: dict[str, Path], tmp_path: Path) -> None:
    make_executable(env["path"] / "llama-server")
    installed(env["router-home"])
    mine = make_executable(tmp_path / "gpu" / "llama-server")
    assert find_llama_server(str(mine)) == mine


def test_configured_bare_name_is_looked_up_on_path(env: dict[str, Path]) -> None:
    custom = make_executable(env["path"] / "llama-server-cuda")
    installed(env["router-home"])
    assert find_llama_server("llama-server-cuda") == custom


def test_configured_but_missing_is_an_error_not_a_fallback(env: dict[str, Path], tmp_path: Path) -> None:
    make_executable(env["path"] / "llama-server")
    installed(env["router-home"])
    missing = tmp_path / "nowhere" / "llama-server"
    with pytest.raises(LlamaServerNotFound) as info:
        find_llama_server(str(missing))
    assert str(missing) in str(info.value)
    with pytest.raises(LlamaServerNotFound, match="llama-server-rocm"):
        find_llama_server("llama-server-rocm")


def test_configured_file_must_be_executable(env: dict[str, Path], tmp_path: Path) -> None:
    plain = make_executable(tmp_path / "llama-server", mode=stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(LlamaServerNotFound):
        find_llama_server(str(plain))
    with pytest.raises(LlamaServerNotFound):
        find_llama_server(str(tmp_path))  # a directory is not a binary


def test_configured_path_expands_user(env: dict[str, Path]) -> None:
    mine = make_executable(env["home"] / "bin" / "llama-server")
    assert find_llama_server("~/bin/llama-server") == mine


def test_path_wins_over_install_location(env: dict[str, Path]) -> None:
    on_path = make_executable(env["path"] / "llama-server")
    installed(env["router-home"])
    assert find_llama_server(None) == on_path
    assert find_llama_server("") == on_path


def test_install_location_is_the_last_resort(env: dict[str, Path]) -> None:
    cached = installed(env["router-home"])
    assert find_llama_server(None) == cached


def test_non_executable_install_is_ignored(env: dict[str, Path]) -> None:
    installed(env["router-home"]).chmod(0o644)
    with pytest.raises(LlamaServerNotFound):
        find_llama_server(None)


def test_not_found_message_says_how_to_install_and_how_to_configure(env: dict[str, Path]) -> None:
    with pytest.raises(LlamaServerNotFound) as info:
        find_llama_server(None)
    message = str(info.value)
    assert "scripts/install-llama-server" in message
    assert "[router]" in message
    assert 'llama_server = "/path/to/llama-server"' in message
    assert "CUDA" in message
    assert "ROCm" in message
    assert str(env["router-home"] / "llama.cpp-11434" / "bin" / "llama-server") in message
    assert isinstance(info.value, RuntimeError)


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-llama-server"


@pytest.mark.parametrize("via", ["LLAMA_ROUTER_HOME", "XDG_CACHE_HOME", "HOME"])
def test_install_script_and_locate_agree_on_the_location(
    env: dict[str, Path], monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """With a working binary already installed the script returns at once and prints its path."""
    if via != "LLAMA_ROUTER_HOME":
        monkeypatch.delenv("LLAMA_ROUTER_HOME")
    if via == "XDG_CACHE_HOME":
        monkeypatch.setenv("XDG_CACHE_HOME", str(env["xdg"]))
    binary = locate.cached_llama_server()
    make_executable(binary).write_text("#!/bin/sh\necho 'version: 11434 (test)'\n")
    make_executable(binary.with_name("ggml-rpc-server")).write_text("#!/bin/sh\n")
    (locate.vocab_dir()).mkdir(parents=True)
    (locate.vocab_dir() / "ggml-vocab-llama-spm.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("PATH", os.defpath)
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines()[-1] == str(binary)
    assert "already installed" in done.stderr
