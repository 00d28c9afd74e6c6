"""A model's own llama-server binary and environment (``llama_server``, ``env``): its replicas run that binary
with those variables beside the router's GPU masks, its flags are checked against that binary's ``--help``,
a change of ``env`` restarts it on reload, and a binary that is missing or whose ``--help`` fails stops
the start with one line naming the key, the value and the fix. The binaries are shell scripts around the
simulated llama-server; each records the arguments it was run with."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest

from router.config.load import ConfigError, config_from_dict
from router.deploy.deployment import prepare
from tests.shell.test_startup import assert_one_line_failure, run_router
from tests.support import REPO
from tests.support.client import post_chat
from tests.support.fakenvml import FakeNvml, fake_nvml_fixture  # noqa: F401  (the `fake_nvml` fixture)
from tests.support.harness import running_router
from tests.support.simconfig import config_document, write_config
from tests.support.simtools import read_records, sim_launcher

HELP = REPO / "tests" / "support" / "llama-server-help.txt"
SHORT_HELP = (
    "-h,    --help, --usage   print usage and exit\n--host HOST   ip address to listen\n--port PORT  port\n"
)
RTX = "NVIDIA GeForce RTX 3090"
VULKAN = (
    "Vulkan0: Intel(R) UHD Graphics 770 (16000 MiB, 15000 MiB free)",
    f"Vulkan1: {RTX} (24576 MiB, 24000 MiB free)",
)


def wrapper(dir: Path, name: str, body: str) -> Path:
    """An executable shell script ``dir/name``: it records its arguments in ``dir/name.runs``, then runs
    ``body``."""
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / name
    path.write_text(f'#!/bin/sh\necho "$*" >> "{path}.runs"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def short_help(dir: Path) -> Path:
    """A help text that lists three flags only: an older or smaller build."""
    path = dir / "short-help.txt"
    path.write_text(SHORT_HELP)
    return path


def runs(binary: Path) -> list[str]:
    file = binary.with_name(binary.name + ".runs")
    return file.read_text().splitlines() if file.exists() else []


def around_the_simulator(dir: Path, name: str = "llama-server") -> Path:
    return wrapper(dir, name, f'exec "{sim_launcher(dir.parent)}" "$@"')


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test reads the binaries' --help afresh (the cache would remember a script of the same size)."""
    monkeypatch.setenv("LLAMA_ROUTER_HOME", str(tmp_path / "home"))


async def test_a_models_own_binary_and_env_reach_its_replicas_beside_the_gpu_masks(tmp_path: Path) -> None:
    vulkan = around_the_simulator(tmp_path / "vk" / "bin")
    env = {"GGML_VK_PREFER_HOST_MEMORY": "1", "LD_LIBRARY_PATH": "/opt/vk/lib", "THREADS": 3}
    models = {
        "own": {"gpus": [1], "llama_server": str(vulkan), "env": env, "metrics": True},
        "plain": {"gpus": [0]},
    }
    async with running_router(tmp_path, models, router={"num_gpus": 2}) as h:
        for name in models:
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
        assert h.router.launches["own"].binary == str(vulkan)
        # A new env on reload restarts the model; the other one keeps running.
        doc = json.loads((tmp_path / "router.json").read_text())
        doc["models"]["own"]["env"] = {"GGML_VK_PREFER_HOST_MEMORY": "0"}
        (tmp_path / "router.json").write_text(json.dumps(doc))
        reply = await h.client.post("/reload", json={})
        assert reply.status_code == 200 and reply.json()["restarted"] == ["own"], reply.text
        assert (await post_chat(h.client, "own", max_tokens=1)).status_code == 200
    own = read_records(h.records_of("own"))
    plain = read_records(h.records_of("plain"))
    first, after_reload = own[0]["env"], own[-1]["env"]
    assert first["GGML_VK_PREFER_HOST_MEMORY"] == "1" and first["LD_LIBRARY_PATH"] == "/opt/vk/lib"
    assert first["THREADS"] == "3"  # an integer, as its digits
    assert first["CUDA_VISIBLE_DEVICES"] == "1"  # the router's mask, beside the model's env
    assert after_reload["GGML_VK_PREFER_HOST_MEMORY"] == "0" and "LD_LIBRARY_PATH" not in after_reload
    assert (
        "GGML_VK_PREFER_HOST_MEMORY" not in plain[0]["env"] and plain[0]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    )
    # The model's binary was asked for its flags and then ran both replicas; the other model never ran it.
    started = [line for line in runs(vulkan) if "--port" in line]
    assert len(started) == 2 and all(str(h.config.models["own"].path) in line for line in started)
    assert "--help" in runs(vulkan) and "--metrics" in started[0]
    assert not any(str(h.config.models["plain"].path) in line for line in runs(vulkan))


async def test_a_vulkan_binary_of_a_model_masks_its_replicas_by_its_own_device_list(
    tmp_path: Path, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml.gpu(0, 24576, used_mib=300, name=RTX, bus_id="00000000:01:00.0")
    monkeypatch.setenv("SIM_LIST_DEVICES", ";".join(VULKAN))
    vulkan = around_the_simulator(tmp_path / "vk" / "bin")
    (tmp_path / "vk" / "lib").mkdir()
    (
        tmp_path / "vk" / "lib" / "libggml-vulkan.so"
    ).touch()  # this build has a Vulkan backend; the router's not
    models = {"own": {"gpus": [0], "llama_server": str(vulkan)}, "plain": {"gpus": [0]}}
    async with running_router(tmp_path, models, router={"max_models_per_gpu": 2}) as h:
        for name in models:
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
    assert read_records(h.records_of("own"))[0]["env"]["GGML_VK_VISIBLE_DEVICES"] == "1"  # not the iGPU
    assert "GGML_VK_VISIBLE_DEVICES" not in read_records(h.records_of("plain"))[0]["env"]


def _prepared(dir: Path, models: dict[str, dict[str, object]], **tables: object) -> None:
    doc = config_document(dir, models, **tables)  # type: ignore[arg-type]
    prepare(config_from_dict(doc, dir / "router.json"))


def test_flags_are_checked_against_the_models_own_binary(tmp_path: Path) -> None:
    short = wrapper(
        tmp_path / "old", "llama-server", f'[ "$1" = --help ] && cat "{short_help(tmp_path)}"\nexit 0'
    )
    with pytest.raises(ConfigError) as info:
        _prepared(tmp_path, {"a": {"llama_server": str(short), "metrics": True}})
    assert str(info.value).endswith(
        f"models.a.metrics = true is not a flag of llama-server ({short} --help, the llama_server of "
        "models.a); remove it or correct its spelling"
    )
    with pytest.raises(ConfigError) as info:  # [defaults] reach the model's binary too
        _prepared(tmp_path, {"a": {"llama_server": str(short)}}, defaults={"metrics": True})
    assert (
        f"defaults.metrics = true is not a flag of llama-server ({short} --help, the llama_server of "
        in str(info.value)
    )
    assert "or set metrics = false in [models.a] to leave it out there" in str(info.value)
    # Leaving the flag out there is enough; the router's binary (the simulator's full list) keeps it for b.
    _prepared(
        tmp_path, {"a": {"llama_server": str(short), "metrics": False}, "b": {}}, defaults={"metrics": True}
    )
    # The router's binary does not judge a model's flags: the full list accepts what the short one lacks.
    full = around_the_simulator(tmp_path / "new")
    _prepared(tmp_path, {"a": {"llama_server": str(full), "metrics": True}})


def test_a_missing_binary_stops_the_start_naming_key_value_and_fix(tmp_path: Path) -> None:
    gone = tmp_path / "opt" / "llama-server"
    doc = config_document(tmp_path, {"a": {"llama_server": str(gone)}})
    line = assert_one_line_failure(run_router("--config", str(write_config(tmp_path, doc))))
    assert (
        f'models.a.llama_server = "{gone}" is invalid: {gone} does not exist; point it at a llama-server '
        in line
    )
    assert "or remove it to run router.llama_server" in line
    assert not (tmp_path / "records").exists()  # nothing was started

    doc["models"]["a"]["llama_server"] = "no-such-llama-server-anywhere"
    line = assert_one_line_failure(run_router("--config", str(write_config(tmp_path, doc))))
    assert 'models.a.llama_server = "no-such-llama-server-anywhere" is invalid: no \'no-such-' in line


def test_a_binary_that_cannot_run_is_refused(tmp_path: Path) -> None:
    plain_file = tmp_path / "llama-server.txt"
    plain_file.write_text("not a program")
    with pytest.raises(ConfigError) as info:
        _prepared(tmp_path, {"a": {"llama_server": str(plain_file)}})
    assert f"{plain_file} is not executable" in str(info.value)
    assert info.value.key == "models.a.llama_server"


def test_a_binary_whose_help_fails_stops_the_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broken = wrapper(
        tmp_path / "broken", "llama-server", 'echo "error while loading shared libraries" >&2\nexit 127'
    )
    doc = config_document(tmp_path, {"a": {"llama_server": str(broken)}})
    line = assert_one_line_failure(run_router("--config", str(write_config(tmp_path, doc))))
    assert line.endswith(
        f'models.a.llama_server = "{broken}" is invalid: its flags cannot be read: `{broken} --help` (exit '
        "status 127) printed no llama-server flag list; point it at a llama-server binary (a path, relative "
        "ones starting at the config file's directory, or a name on PATH), or remove it to run "
        "router.llama_server"
    ), line
    assert runs(broken) == ["--help"]  # asked for its flags, never started
    with caplog.at_level(logging.WARNING):
        with pytest.raises(ConfigError):  # in-process too, and again from the memory of the first reading
            _prepared(tmp_path, {"a": {"llama_server": str(broken)}})
        with pytest.raises(ConfigError) as info:
            _prepared(tmp_path, {"a": {"llama_server": str(broken)}})
    assert "printed no llama-server flag list" in str(info.value)
