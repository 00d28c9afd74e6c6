"""An original llama-router configuration (config.json with ROUTER/LLM sections + presets.ini) loads as it
is: translated into our document, validated by our rules, its errors named by the original file and key,
its keys without meaning here reported once."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from router.__main__ import main
from router.config.load import (
    ALL_GPUS,
    ConfigError,
    Pricing,
    ReasoningEffort,
    config_from_dict,
    load_config,
)
from router.config.original import is_original, translate
from router.config.source import ConfigSource
from tests.support import REPO
from tests.support.original_config import original_config_json, write_original_pair
from tests.support.realenv import tiny_model

MODELS = {"chat-small": "models/chat.gguf", "coder": "/srv/models/coder.gguf", "embedder": "embed.gguf"}


def pair(tmp_path: Path, **kwargs: object) -> tuple[Path, Path]:
    return write_original_pair(tmp_path, MODELS, **kwargs)  # type: ignore[arg-type]


def error_of(path: Path, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env or {})
    return caught.value


def test_the_realistic_pair_translates_key_by_key(tmp_path: Path) -> None:
    config_file, _ = pair(tmp_path)
    config = load_config(config_file, env={})
    router = config.router
    assert (router.port, router.llama_server) == (11434, "/opt/llama.cpp/bin/llama-server")
    assert (router.max_models_per_gpu, router.eviction, router.num_gpus) == (2, "fifo", 2)
    assert (router.queue_head_grace, router.queue_force_load_timeout) == (1.5, 240.0)
    assert router.stop_timeout == 4.0
    assert router.load_timeout == 110.0  # HEALTH_CHECK_TIMEOUT 20 + LOAD_POLL_TIMEOUT 90
    assert list(config.models) == ["chat-small", "coder", "embedder"]
    chat, coder, embedder = config.models.values()
    assert chat.path == tmp_path / "models" / "chat.gguf"  # relative to presets.ini
    assert (chat.gpus, chat.num_instance, chat.parallel, chat.ctx, chat.gpu_layers) == ((0,), 2, 2, 4096, 99)
    assert chat.pricing == Pricing(input=0.2, cached_input=0.05, output=0.8)
    assert chat.reasoning_effort == ReasoningEffort(("low", "medium", "high"), "medium", "none")
    assert chat.extra_args == (("b", 512),)  # device = CUDA0 is dropped: gpus masks the replica
    assert coder.path == Path("/srv/models/coder.gguf")  # written as `m`
    assert (coder.gpus, coder.ctx) == (ALL_GPUS, 2048)
    # a list of levels: the original advertised the first one as the default
    assert coder.reasoning_effort == ReasoningEffort(("minimal", "high"), "minimal")
    # cram is the router's own key; the model's own wins over [*]
    assert coder.cram == 512 and dict(coder.extra_args) == {"temp": 0.2}
    assert (embedder.gpus, dict(embedder.extra_args)) == ((1,), {"embeddings": True})  # port dropped
    assert dict(config.defaults) == {
        "jinja": True,
        "fa": "on",
        "ctk": "q8_0",
        "ctv": "q8_0",
        "cache-prompt": True,
    }
    assert chat.cram == 2048  # [*] cram: every model's unless it sets its own


def test_the_keys_without_meaning_are_reported_once_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_file, presets = pair(tmp_path)
    with caplog.at_level(logging.WARNING, logger="router"):
        load_config(config_file, env={})
        load_config(config_file, env={})  # a reload: nothing new to say
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    ignored = [line.split(": ", 1)[1].split(" is ignored")[0] for line in lines]
    assert ignored == [
        "LLM-base-port",
        "ROUTER.HEALTH_CHECK_INTERVAL",
        "ROUTER.UNLOAD_POLL_INTERVAL",
        "ROUTER.UNLOAD_POLL_TIMEOUT",
        "ROUTER.LOAD_POLL_INTERVAL",
        "ROUTER.START_RETRIES",
        "[chat-small] device",
        "[embedder] port",
    ]
    assert f"{presets}: [chat-small] device is ignored: each replica sees only the GPUs" in lines[6]
    assert "free port" in lines[0]


def test_our_own_documents_are_never_taken_for_original_ones() -> None:
    assert not is_original({"router": {"port": 1}, "models": {"m": {"model": "m.gguf"}}})
    assert is_original({"LLM": {}}) and is_original({"ROUTER": {}}) and is_original({"API-port": 1})


def test_presets_path_from_the_environment_and_ini_spellings(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    config_file = tmp_path / "etc" / "config.json"
    config_file.write_text(json.dumps({"LLM": {"q": {"num_instance": 1}}}))
    presets = tmp_path / "llama-presets.ini"
    presets.write_text(
        "[*]\nc = 8192\nparallel = 4\nnum_instance = 2\n\n"
        "[q]\nmodel = weights/q.gguf\ngpus = 0,1\nreasoning_effort = low, high\n"
        "reasoning_effort.disable = none\ncost.output = 1.5\nalias = quick, q-small\n"
        "load-on-startup = true\n\n"
        "[r]\nm = /abs/r.gguf\ngpus = -1\nc = 1024\nreasoning_effort = "
        '{"options": ["a", "b"], "default": "b"}\ncost = {"input": 0.1}\n'
    )
    config = load_config(config_file, env={"LLAMA_PRESETS_PATH": str(presets)})
    q, r = config.models["q"], config.models["r"]
    assert q.path == tmp_path / "weights" / "q.gguf"
    # num_instance from config.json wins over [*]; ctx and parallel from [*] reach every model
    assert (q.gpus, q.num_instance, q.ctx, q.parallel) == ((0, 1), 1, 8192, 4)
    assert q.reasoning_effort == ReasoningEffort(("low", "high"), "low", "none")
    assert q.pricing == Pricing(output=1.5)
    assert (q.aliases, q.load_on_startup) == (("quick", "q-small"), True)
    assert (r.gpus, r.num_instance, r.ctx, r.parallel) == (ALL_GPUS, 2, 1024, 4)  # a section of its own
    assert r.reasoning_effort == ReasoningEffort(("a", "b"), "b")
    assert r.pricing == Pricing(input=0.1)


def test_a_bad_translated_value_names_the_original_file_and_key(tmp_path: Path) -> None:
    config_file, presets = pair(tmp_path)
    presets.write_text(presets.read_text().replace("c = 2048\ncram", "c = 0\ncram"))
    error = error_of(config_file)
    assert str(error) == (
        f"config error in {presets}: [coder] c: models.coder.ctx = 0 is invalid: must be an integer >= 1 "
        "and >= `parallel`"
    )
    assert error.key == "models.coder.ctx"

    config_file, presets = pair(tmp_path)
    config_file.write_text(json.dumps({**original_config_json(), "ROUTER": {"EVICTION_POLICY": "random"}}))
    error = error_of(config_file)
    assert str(error).startswith(
        f'config error in {config_file}: ROUTER.EVICTION_POLICY: router.eviction = "random" is invalid'
    )

    doc = original_config_json()
    doc["LLM"]["coder"]["reasoning_effort"] = {"options": ["low"], "default": "max"}
    config_file.write_text(json.dumps(doc))
    assert str(error_of(config_file)).startswith(
        f"config error in {config_file}: LLM.coder.reasoning_effort: models.coder.reasoning_effort.default"
    )


def test_a_model_without_a_file_and_a_missing_presets_file_are_named(tmp_path: Path) -> None:
    config_file, presets = pair(tmp_path)
    presets.write_text(presets.read_text().replace("m = /srv/models/coder.gguf\n", ""))
    error = error_of(config_file)
    assert str(error).startswith(f"config error in {presets}: [coder] has no model key")

    presets.unlink()
    error = error_of(config_file)
    assert "no presets.ini was found beside this file and LLAMA_PRESETS_PATH is not set" in str(error)
    error = error_of(config_file, {"LLAMA_PRESETS_PATH": str(tmp_path / "gone.ini")})
    assert error.key == "LLAMA_PRESETS_PATH" and "no such file" in str(error)

    presets.write_text("[coder\nmodel = x\n")
    error = error_of(config_file)
    assert str(error).startswith(f"config error in {presets}: not a valid presets file")


def test_reasoning_effort_disable_is_a_key_of_ours_too() -> None:
    doc = {"models": {"m": {"model": "m.gguf", "reasoning_effort": {"options": ["high"], "disable": "none"}}}}
    assert config_from_dict(doc).models["m"].reasoning_effort == ReasoningEffort(("high",), None, "none")
    doc["models"]["m"]["reasoning_effort"]["disable"] = ""
    with pytest.raises(ConfigError, match=r"reasoning_effort.disable = \"\" is invalid: must be a non-empty"):
        config_from_dict(doc)


def test_a_models_folder_adds_to_an_original_config(tmp_path: Path) -> None:
    config_file, _ = pair(tmp_path)
    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "extra.gguf").write_bytes(tiny_model().read_bytes())
    config = ConfigSource(file=config_file, models_dir=folder).load(env={})
    assert list(config.models) == ["chat-small", "coder", "embedder", "extra"]
    assert config.router.max_models_per_gpu == 2


def test_import_config_prints_toml_that_loads_and_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = {name: str(tiny_model()) for name in MODELS}
    config_file, presets = write_original_pair(tmp_path, weights, num_gpus=None)
    assert main(["import-config", str(config_file), str(presets)]) == 0
    text = capsys.readouterr().out
    data = tomllib.loads(text)
    assert data == translate(config_file, json.loads(config_file.read_text()), presets).document
    assert "#   config.json ROUTER.START_RETRIES: a failed load is not retried as such" in text
    assert "# config.json LLM.coder.reasoning_effort: the original advertised the first option" in text
    toml = tmp_path / "imported.toml"
    toml.write_text(text)
    assert load_config(toml, env={}).models["coder"].reasoning_effort == ReasoningEffort(
        ("minimal", "high"), "minimal"
    )
    planned = subprocess.run(
        [sys.executable, "-m", "router", "plan", "--config", str(toml)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "chat-small" in planned.stdout and "embedder" in planned.stdout


def test_import_config_refuses_what_it_cannot_translate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"models": {"m": {"model": "m.gguf"}}}))
    assert main(["import-config", str(ours)]) == 2
    assert "not an original llama-router config.json" in capsys.readouterr().err
    config_file, presets = pair(tmp_path)
    presets.write_text(presets.read_text().replace("parallel = 2", "parallel = 0"))
    assert main(["import-config", str(config_file)]) == 2
    assert "[chat-small] parallel: models.chat-small.parallel = 0 is invalid" in capsys.readouterr().err
