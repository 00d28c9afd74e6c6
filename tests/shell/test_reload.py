"""Config reload (POST /reload, SIGHUP): unchanged models keep serving, changed ones drain, bad files fail."""

from __future__ import annotations

import json
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.client import SseEvent, assert_openai_error, chat_body, post_chat, stream
from tests.support.harness import running_router
from tests.support.routerproc import router_process
from tests.support.simtools import read_records
from tests.support.waiting import until

MODELS: dict[str, Any] = {
    "a": {"parallel": 1, "gpus": [0], "sim": {"tokens": 300, "token_rate": 100.0}},
    "b": {"parallel": 1, "gpus": [1], "sim": {"tokens": 4}},
}
ROUTER = {"num_gpus": 2}


def _edit(dir: Path, change: Any) -> None:
    path = dir / "router.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


async def test_reload_keeps_an_unchanged_stream_and_restarts_what_changed(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, router=ROUTER) as rt:
        assert (await post_chat(rt.client, "b", max_tokens=2)).status_code == 200
        b_pid = (await rt.status())["replicas"][0]["pid"]
        results: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            first = trio.Event()

            def seen(event: SseEvent) -> None:
                if event.data is not None:  # a token, not a comment sent while the model loads
                    first.set()

            async def long() -> None:
                results["a"] = await stream(rt.client, "/v1/chat/completions", chat_body("a"), on_event=seen)
                first.set()

            nursery.start_soon(long)
            await first.wait()
            a_pid = next(r["pid"] for r in (await rt.status())["replicas"] if r["model"] == "a")

            def change(doc: dict[str, Any]) -> None:
                doc["models"]["b"]["parallel"] = 2
                doc["models"]["c"] = {**doc["models"]["b"], "gpus": [1], "parallel": 1}

            _edit(rt.dir, change)
            reply = await rt.client.post("/reload", json={})
            reloaded = trio.current_time()
            assert reply.status_code == 200, reply.text
            assert reply.json()["restarted"] == ["b"]
        a = results["a"]
        # The stream went on through the reload, from the same replica (below), to its end.
        assert a.done and not a.errors and len(a.tokens) >= 300
        assert a.first_token_at < reloaded < a.last_token_at
        status = await rt.status()
        assert any(r["model"] == "a" and r["pid"] == a_pid for r in status["replicas"])
        assert not any(r["pid"] == b_pid and r["state"] != "stopping" for r in status["replicas"])
        for name in ("a", "b", "c"):
            assert (await post_chat(rt.client, name, max_tokens=2)).status_code == 200, name
        assert {m["id"] for m in (await rt.models())["data"]} >= {"a", "b", "c"}
        assert rt.router.state.settings.models["b"].slots == 2


async def test_an_invalid_new_config_is_refused_and_the_old_one_keeps_serving(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, router=ROUTER) as rt:
        _edit(rt.dir, lambda doc: doc["models"]["a"].update(parallel=0))
        reply = await rt.client.post("/reload", json={})
        error = assert_openai_error(reply, 400, "invalid_config")
        assert "models.a.parallel = 0" in error["message"]
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200


def _binary_without_fit(dir: Path) -> Path:
    """A llama-server stand-in of build 9000 whose --help (b11434's, from the fixture) lacks --fit."""
    help_text = (Path(__file__).resolve().parents[1] / "support" / "llama-server-help.txt").read_text()
    dir.mkdir(parents=True)
    kept = [line for line in help_text.splitlines(True) if line != "-fit, --fit\n"]
    assert len(kept) == len(help_text.splitlines()) - 1
    (dir / "help.txt").write_text("".join(kept))
    binary = dir / "llama-server"
    binary.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --help) cat "{dir / "help.txt"}" ;; --version) echo "version: 9000 (deadbee)" >&2 ;; '
        '*) echo "error: invalid argument: $1" >&2; exit 1 ;; esac\n'
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


async def test_a_llama_server_without_a_flag_the_router_passes_is_refused_and_the_old_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_ROUTER_HOME", str(tmp_path / "home"))
    old = _binary_without_fit(tmp_path / "old")
    async with running_router(tmp_path, MODELS, router=ROUTER) as rt:
        sim = str(tmp_path / "sim-llama-server")
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200
        (pid,) = [r["pid"] for r in (await rt.status())["replicas"]]
        _edit(rt.dir, lambda doc: doc["router"].update(llama_server=str(old)))
        error = assert_openai_error(await rt.client.post("/reload", json={}), 400, "invalid_config")
        assert error["message"] == (
            f"llama-server {old} (build 9000) lacks --fit, which llama-router passes to every replica; "
            "llama-router needs llama.cpp build b11434 or newer: update llama.cpp or point [router] "
            "llama_server at a newer binary"
        )
        assert rt.router.config.router.llama_server == sim
        assert {launch.binary for launch in rt.router.launches.values()} == {sim}
        assert (await post_chat(rt.client, "a", max_tokens=2)).status_code == 200
        assert (await post_chat(rt.client, "b", max_tokens=2)).status_code == 200  # loads with the old binary
        status = await rt.status()
        assert pid in [r["pid"] for r in status["replicas"]]
        assert [(e["path"], e["build"]) for e in status["llama_server"]] == [(sim, 11434)]
        argv0 = {record["argv"][0] for m in ("a", "b") for record in read_records(rt.records_of(m))}
        assert argv0 == {sim}


async def test_removed_models_drain_and_their_waiters_are_answered(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, router=ROUTER) as rt:
        assert (await post_chat(rt.client, "b", max_tokens=2)).status_code == 200
        _edit(rt.dir, lambda doc: doc["models"].pop("b"))
        assert (await rt.client.post("/reload", json={})).status_code == 200
        await rt.wait_state(lambda s: not any(r.model == "b" for r in s.replicas))
        assert_openai_error(await post_chat(rt.client, "b"), 404, "model_not_found")


async def test_sighup_reloads_a_running_router(tmp_path: Path) -> None:
    async with router_process(tmp_path, MODELS, router=ROUTER) as proc:
        _edit(tmp_path, lambda doc: doc["models"].update(c=dict(doc["models"]["b"])))
        proc.signal(signal.SIGHUP)

        async def reloaded() -> bool:
            reply = await proc.client.get("/v1/models")
            return "c" in {m["id"] for m in reply.json()["data"]}

        await until(reloaded, what="c listed after SIGHUP")
        reply = await proc.client.post("/v1/chat/completions", json=chat_body("c", max_tokens=2))
        assert reply.status_code == 200
