"""An original llama-router configuration pair, unmodified, runs ``python -m router`` on the real
llama-server: ROUTER_CONFIG_PATH names the config.json, LLAMA_PRESETS_PATH its presets.ini, as the original
read them."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from router.shell.ports import free_port
from tests.support import REPO
from tests.support.original_config import write_original_pair
from tests.support.processes import launched
from tests.support.realenv import require_llama_server
from tests.support.realharness import long_body, real_model
from tests.support.routerproc import router_env

pytestmark = pytest.mark.real


def test_an_original_pair_serves_a_chat_request_unchanged(tmp_path: Path) -> None:
    binary = require_llama_server()
    # chat-small is the wide shape: its heads of 32 take the q8_0 cache of the [*] section
    weights = {
        "chat-small": real_model("wide"),
        "coder": real_model("small"),
        "embedder": real_model("other"),
    }
    port = free_port()
    (tmp_path / "configs").mkdir()
    config, presets = write_original_pair(
        tmp_path / "configs",
        weights,
        port=port,
        binary=str(binary),
        threads=1,
        router_extra={"HEALTH_CHECK_TIMEOUT": 20.0, "LOAD_POLL_TIMEOUT": 40.0},
    )
    presets = presets.rename(tmp_path / "llama-presets.ini")  # found through LLAMA_PRESETS_PATH only
    env = {
        **router_env(),
        "ROUTER_CONFIG_PATH": str(config),
        "LLAMA_PRESETS_PATH": str(presets),
        "ROUTER_HOST": "127.0.0.1",
        "HISTORY_DB_PATH": str(tmp_path / "history.db"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    url = f"http://127.0.0.1:{port}"
    with launched(
        [sys.executable, "-m", "router"], url, tmp_path / "router.log", name="the router", env=env, cwd=REPO
    ) as router:
        with httpx.Client(base_url=url, timeout=120.0) as client:
            models = {entry["id"]: entry for entry in client.get("/v1/models").json()["data"]}
            assert list(models) == ["chat-small", "coder", "embedder"]
            assert models["chat-small"]["reasoning_effort"] == {
                "options": ["low", "medium", "high"],
                "default": "medium",
                "disable": "none",
            }
            assert models["chat-small"]["pricing"] == {"input": 0.2, "cached_input": 0.05, "output": 0.8}
            assert models["chat-small"]["ctx"] == 4096 and models["chat-small"]["parallel"] == 2

            reply = client.post("/v1/chat/completions", json=long_body("chat-small", 4))
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 4

            status = client.get("/status").json()
        log = router.log_text()
    assert "LLM-base-port is ignored" in log and "[chat-small] device is ignored" in log
    replica_logs = list((tmp_path / "state" / "llama-router" / "logs").glob("chat-small-*.log"))
    assert replica_logs, status
    argv_line = replica_logs[0].read_text(errors="replace")
    for words in ("--cache-ram 2048", "-ctk q8_0", "-b 512", "--threads 1", "-c 4096", "-np 2"):
        assert words in argv_line, (words, argv_line[:2000])
    assert "CUDA0" not in argv_line
