"""A model's request filters and its own binary and environment, with the real llama-server: a forced
``max_tokens`` stops a reply that asked for more, and a model whose ``llama_server`` is a script around the
real binary runs it with the model's ``env``."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.realenv import require_llama_server
from tests.support.realharness import long_body, real_router

pytestmark = pytest.mark.real


async def test_set_params_caps_the_reply_and_strip_params_drops_a_field(tmp_path: Path) -> None:
    models = {
        "capped": {"gpus": [0], "set_params": {"max_tokens": 3}, "strip_params": ["n_predict"]},
        "free": {"gpus": [1], "shape": "other"},
    }
    async with real_router(tmp_path, models, router={"num_gpus": 2}) as rt:
        body = {**long_body("capped", 50), "n_predict": 40}  # both caps the client asked for are replaced
        reply = await rt.client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 3
        reply = await rt.client.post("/v1/completions", json={**long_body("capped", 50), "prompt": "Once"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 3
        # A model without filters serves what was asked.
        reply = await rt.client.post("/v1/chat/completions", json=long_body("free", 7))
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 7


async def test_a_models_own_binary_runs_with_its_env(tmp_path: Path) -> None:
    real = require_llama_server()
    script = tmp_path / "bin" / "llama-server-own"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$*" >> "{script}.runs"\nexec "{real}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    models = {"own": {"llama_server": str(script), "env": {"LLAMA_ROUTER_TEST_MARK": "own-build"}}}
    async with real_router(tmp_path, models) as rt:
        reply = await rt.client.post("/v1/chat/completions", json=long_body("own", 2))
        assert reply.status_code == 200, reply.text
        (replica,) = rt.router.state.replicas
        info = rt.router.supervisor.info(replica.id)
        assert info is not None and info.pid is not None
        environ = Path(f"/proc/{info.pid}/environ").read_bytes().split(b"\0")
        exe = Path(f"/proc/{info.pid}/exe").resolve()
    assert b"LLAMA_ROUTER_TEST_MARK=own-build" in environ
    assert b"CUDA_VISIBLE_DEVICES=0" in environ  # the router's mask beside it
    assert exe == real.resolve()  # the script handed over to the real binary
    started = [line for line in (tmp_path / "bin" / "llama-server-own.runs").read_text().splitlines()]
    assert "--help" in started and any("--port" in line and "--fit off" in line for line in started)
