"""Pass-through keys checked against the flags the configured llama-server lists in its --help: at startup
(exit 2), on reload (400, the old configuration keeps serving), with "did you mean" suggestions."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from router.config.llama_args import SHORT_FLAGS, render_flag
from router.config.load import ConfigError, config_from_dict
from router.hosts import server_flags
from router.hosts.server_flags import accepted_flags, check_flags, flag_problem, parse_help
from tests.support import REPO
from tests.support.client import assert_openai_error, post_chat
from tests.support.harness import running_router
from tests.support.realenv import require_llama_server
from tests.support.simconfig import config_document, write_config

HELP_FIXTURE = Path(__file__).resolve().parents[1] / "support" / "llama-server-help.txt"
ACCEPTED = parse_help(HELP_FIXTURE.read_text())
BINARY = Path("/opt/llama/bin/llama-server")
HOME_ENV = "LLAMA_ROUTER_HOME"
ORIGINAL_HOME = os.environ.get(HOME_ENV)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag caches go to this test's directory, and nothing is remembered from other tests."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(server_flags, "_memo", {})


def test_the_help_text_gives_every_spelling() -> None:
    assert {"-ctk", "--cache-type-k", "-np", "--parallel", "--port", "-dt", "--embeddings"} <= ACCEPTED
    assert {"--embedding", "--pooling", "--reranking", "--rerank", "-no-kvu", "--no-kv-unified"} <= ACCEPTED
    assert all(flag.startswith("-") and "," not in flag for flag in ACCEPTED)
    assert "-1" not in ACCEPTED and "--" not in ACCEPTED
    for short, long in SHORT_FLAGS.items():  # the router's spelling table agrees with llama-server
        assert render_flag(short) in ACCEPTED and render_flag(long) in ACCEPTED, short


@pytest.mark.parametrize(
    ("key", "in_model", "expected"),
    [
        ("threads", True, None),
        ("ctk", True, None),
        ("-ngl", True, None),
        ("embeddings", True, None),
        ("paralel", True, "; did you mean `parallel` (use the `parallel` key)?"),
        ("gpu", True, "; did you mean `gpus` (use the `gpus` key)?"),
        ("gpu", False, "; did you mean `gpus`?"),
        ("thread", True, "; did you mean `threads`?"),
        ("flash_attn", False, "; did you mean `flash-attn`?"),
        ("ctx_size", True, "; did you mean `ctx-size` (use the `ctx` key)?"),
        ("cramm", False, "; did you mean `cram`?"),
        ("cache_ram", False, "; did you mean `cache-ram` (use the `cram` key)?"),
        ("cache_ram", True, "; did you mean `cache-ram` (use the `cram` key)?"),
        ("dt", True, ' as written (`--dt`); llama-server spells it `-dt`: write the key as "-dt"'),
        ("zzzzzz", True, "; remove it or correct its spelling"),
    ],
)
def test_problems_and_suggestions(key: str, in_model: bool, expected: str | None) -> None:
    assert flag_problem(key, ACCEPTED, in_model=in_model) == expected


def _config(models: dict[str, Any], defaults: dict[str, Any] | None = None) -> Any:
    doc: dict[str, Any] = {"models": models}
    if defaults:
        doc["defaults"] = defaults
    return config_from_dict(doc, "/etc/router.toml")


def test_check_flags_names_key_value_binary_and_fix() -> None:
    config = _config({"a": {"model": "a.gguf", "paralel": 2}})
    with pytest.raises(ConfigError) as info:
        check_flags(config, BINARY, ACCEPTED)
    assert str(info.value) == (
        "config error in /etc/router.toml: models.a.paralel = 2 is not a flag of llama-server "
        f"({BINARY} --help); did you mean `parallel` (use the `parallel` key)?"
    )
    assert info.value.key == "models.a.paralel"
    config = _config({"a": {"model": "a.gguf", "gpu": [1]}})
    with pytest.raises(ConfigError, match=r"models\.a\.gpu = \[1\] is not a flag .* did you mean `gpus`"):
        check_flags(config, BINARY, ACCEPTED)
    config = _config({"a": {"model": "a.gguf"}}, defaults={"metrics": True, "no-mmap": True})
    with pytest.raises(ConfigError, match=r"defaults\.no-mmap = true is not a flag of llama-server"):
        check_flags(config, BINARY, ACCEPTED)
    check_flags(_config({"a": {"model": "a.gguf", "ctk": "q8_0", "metrics": False}}), BINARY, ACCEPTED)


def _fake_binary(dir: Path, help_text: str) -> tuple[Path, Path]:
    """A llama-server stand-in that prints ``help_text`` for --help and counts its runs."""
    dir.mkdir(parents=True, exist_ok=True)
    runs = dir / "runs"
    text = dir / "help.txt"
    text.write_text(help_text)
    binary = dir / "llama-server"
    binary.write_text(f'#!/bin/sh\necho run >> "{runs}"\ncat "{text}"\n')
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary, runs


def _runs(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_the_flags_are_cached_per_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary, runs = _fake_binary(tmp_path / "bin", HELP_FIXTURE.read_text())
    assert accepted_flags(binary) == ACCEPTED
    assert _runs(runs) == 1
    (cache,) = (tmp_path / "home").glob("flags-*.json")
    assert json.loads(cache.read_text())["binary"] == str(binary)
    assert accepted_flags(binary) == ACCEPTED  # remembered in this process
    monkeypatch.setattr(server_flags, "_memo", {})
    assert accepted_flags(binary) == ACCEPTED  # read from the cache file
    assert _runs(runs) == 1
    monkeypatch.setattr(server_flags, "_memo", {})
    stamp = binary.stat().st_mtime_ns + 5_000_000_000
    os.utime(binary, ns=(stamp, stamp))  # a rebuilt binary is asked again
    assert accepted_flags(binary) == ACCEPTED
    assert _runs(runs) == 2


def test_a_help_without_a_flag_list_skips_the_check_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    binary, _ = _fake_binary(tmp_path / "bin", "usage: something else\n")
    with caplog.at_level(logging.WARNING, logger="router"):
        assert accepted_flags(binary) is None
        assert accepted_flags(binary) is None
    warnings = [r.getMessage() for r in caplog.records if "not checked" in r.getMessage()]
    assert len(warnings) == 1 and "printed no llama-server flag list" in warnings[0]
    assert not list((tmp_path / "home").glob("flags-*.json"))


def test_the_simulator_lists_the_real_flags(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.simserver", "--help"], capture_output=True, check=True, cwd=REPO
    )
    assert parse_help(done.stdout.decode()) == ACCEPTED


@pytest.mark.real
def test_the_real_binary_lists_what_the_fixture_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture is llama-server b11434's own --help; the installed binary must still agree with it."""
    if ORIGINAL_HOME is None:
        monkeypatch.delenv(HOME_ENV)
    else:
        monkeypatch.setenv(HOME_ENV, ORIGINAL_HOME)
    binary = require_llama_server()  # found where the install script put it
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    flags = accepted_flags(binary)
    assert flags is not None
    assert {"--embeddings", "--pooling", "--reranking", "--parallel", "-ctk"} <= flags
    assert flags == ACCEPTED


def test_startup_refuses_a_misspelt_flag(tmp_path: Path) -> None:
    doc = config_document(tmp_path, {"a": {"paralel": 2, "sim": {}}})
    path = write_config(tmp_path, doc)
    env = {**os.environ, HOME_ENV: str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "router", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        "models.a.paralel = 2 is not a flag of llama-server ("
        f"{tmp_path / 'sim-llama-server'} --help); did you mean `parallel` (use the `parallel` key)?"
    ) in done.stderr


def _edit(dir: Path, change: Any) -> None:
    path = dir / "router.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


async def test_reload_refuses_a_misspelt_flag_and_keeps_serving(tmp_path: Path) -> None:
    async with running_router(tmp_path, {"a": {"sim": {"tokens": 2}}}) as rt:
        _edit(rt.dir, lambda doc: doc["models"]["a"].update(paralel=2))
        error = assert_openai_error(await rt.client.post("/reload", json={}), 400, "invalid_config")
        assert "models.a.paralel = 2 is not a flag of llama-server" in error["message"]
        assert "did you mean `parallel` (use the `parallel` key)?" in error["message"]
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200

        _edit(rt.dir, lambda doc: (doc["models"]["a"].pop("paralel"), doc["models"]["a"].update(gpu=[1])))
        error = assert_openai_error(await rt.client.post("/reload", json={}), 400, "invalid_config")
        assert "models.a.gpu = [1] is not a flag of llama-server" in error["message"]
        assert "did you mean `gpus`" in error["message"]

        _edit(rt.dir, lambda doc: (doc["models"]["a"].pop("gpu"), doc["models"]["a"].update(threads=2)))
        reply = await rt.client.post("/reload", json={})
        assert reply.status_code == 200, reply.text
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200
