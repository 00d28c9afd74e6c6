"""Serving a folder of GGUF files: what the scan finds (models, split shards, projectors), the configuration
made from it (alone and with a config file), ``--models-dir`` through the simulated llama-server, and
``init``, whose output loads and plans."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from router.cli.tinymodel import TinyShape
from router.config.load import ALL_GPUS, ConfigError
from router.config.model_folder import scan_folder
from router.config.source import ConfigSource
from router.deploy.bridge import plan
from router.placement.gguf_header import read_header
from router.placement.synthetic import SyntheticModel, write_header_only
from router.shell.ports import free_port
from tests.support import REPO
from tests.support.client import chat_body
from tests.support.harness import serving_config
from tests.support.realenv import require_llama_server, tiny_model
from tests.support.simtools import sim_launcher, write_sim_sidecar
from tests.support.waiting import until

# ------------------------------------------------------------------------------------------------- files


def header_only(path: Path, arch: str, keys: dict[str, Any], tensors: Sequence[tuple[str, int]] = ()) -> Path:
    """A GGUF header (no tensor data): these keys (ints as uint32) and f32 tensors of these lengths."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, arch)
    for key, value in keys.items():
        if isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    for name, length in tensors:
        w.add_tensor_info(name, (length,), np.dtype(np.float32), length * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def projector(path: Path, width: int | None = None, *, named_type: bool = False) -> Path:
    """A multimodal projector's header: architecture clip (and general.type mmproj when asked)."""
    keys: dict[str, Any] = {"clip.has_vision_encoder": 1}
    if width is not None:
        keys["clip.vision.projection_dim"] = width
    if named_type:
        keys["general.type"] = "mmproj"
    return header_only(path, "clip", keys, [("v.patch_embd.weight", 64)])


def text_model(path: Path, width: int = 64) -> Path:
    """A text model's header (never loaded): enough for the scan."""
    keys = {"llama.block_count": 2, "llama.context_length": 4096, "llama.embedding_length": width}
    return header_only(path, "llama", keys, [("token_embd.weight", 64)])


def tiny(path: Path, seed: int) -> Path:
    """A real tiny model (loads in llama-server) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_model(TinyShape(seed=seed)), path)
    return path


def folder_of_everything(root: Path) -> Path:
    """Two tiny models, a split pair, a projector for one of them, and what is not a model."""
    tiny(root / "alpha.gguf", 1)
    tiny(root / "Beta Chat.gguf", 2)
    tiny(root / "big-00001-of-00002.gguf", 3)
    (root / "big-00002-of-00002.gguf").write_bytes(b"the second shard is never read by the scan")
    text_model(root / "lost-00001-of-00003.gguf")
    text_model(root / "lost-00003-of-00003.gguf")
    projector(root / "mmproj-alpha-f16.gguf", 64)
    (root / "notes.gguf").write_text("not a GGUF file")
    header_only(root / "style-lora.gguf", "llama", {"general.type": "adapter"}, [("blk.0.attn_q.lora_a", 64)])
    header_only(root / "ggml-vocab-llama.gguf", "llama", {"tokenizer.ggml.model": "llama"})
    (root / "readme.txt").write_text("not even a .gguf")
    text_model(root / ".hidden" / "secret.gguf")
    text_model(root / "vision" / "eyes.gguf")
    projector(root / "vision" / "projector.gguf", named_type=True)  # no "mmproj" in the name: the header says
    text_model(root / "vision" / "copies" / "alpha.gguf")  # a second "alpha"
    return root


# ----------------------------------------------------------------------------------------------- the scan


def test_the_scan_finds_models_shards_and_projectors(tmp_path: Path) -> None:
    scan = scan_folder(folder_of_everything(tmp_path / "models"))
    root = tmp_path / "models"
    found = {m.name: m for m in scan.models}
    assert list(found) == ["Beta-Chat", "alpha", "big", "eyes"]
    assert found["alpha"].mmproj == root / "mmproj-alpha-f16.gguf"
    assert found["big"].path == root / "big-00001-of-00002.gguf"
    assert found["big"].files == (root / "big-00001-of-00002.gguf", root / "big-00002-of-00002.gguf")
    assert found["eyes"].mmproj == root / "vision" / "projector.gguf"  # the only model of its folder
    assert found["Beta-Chat"].mmproj is None and found["big"].mmproj is None
    facts = found["alpha"].facts
    assert (facts.architecture, facts.layers, facts.trained_ctx, facts.embedding) == ("llama", 2, 2048, 64)
    assert facts.size_bytes == (root / "alpha.gguf").stat().st_size
    assert found["big"].facts.size_bytes == sum(p.stat().st_size for p in found["big"].files)
    warnings = "\n".join(scan.warnings)
    assert f"{root / 'Beta Chat.gguf'} is served as 'Beta-Chat'" in warnings
    assert "skipped the split model lost" in warnings and "shard 00002 of 00003 missing" in warnings
    assert f"skipped {root / 'notes.gguf'}: not a readable GGUF file" in warnings
    assert f"skipped {root / 'style-lora.gguf'}: a LoRA adapter" in warnings
    assert f"skipped {root / 'ggml-vocab-llama.gguf'}: it holds no tensors" in warnings
    copy = root / "vision" / "copies" / "alpha.gguf"
    assert f"skipped {copy}: the name 'alpha' is already taken" in warnings
    assert "secret" not in warnings and "readme" not in warnings and "big-00002" not in warnings


def test_projectors_go_to_the_longest_shared_name_prefix(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("gemma-3-4b-it-Q4_K_M", "gemma-3-4b-it-Q8_0", "gemma-3-12b-it-Q4_K_M", "Qwen2.5-VL-7B"):
        text_model(root / f"{name}.gguf", width=2560 if "4b" in name else 3840)
    projector(root / "mmproj-gemma-3-4b-it-f16.gguf", 2560)
    projector(root / "gemma-3-4b-it-mmproj-bf16.gguf", 2560)  # a second fit for the 4b models
    projector(root / "mmproj-Qwen3-VL-f16.gguf")  # "Qwen" is no shared word: pairs with nothing
    projector(root / "mmproj-gemma-3-12b-it-f16.gguf", 9999)  # a width no model has
    scan = scan_folder(root)
    paired = {m.name: m.mmproj.name if m.mmproj else None for m in scan.models}
    assert paired == {
        "Qwen2.5-VL-7B": None,
        "gemma-3-12b-it-Q4_K_M": None,
        "gemma-3-4b-it-Q4_K_M": "gemma-3-4b-it-mmproj-bf16.gguf",
        "gemma-3-4b-it-Q8_0": "gemma-3-4b-it-mmproj-bf16.gguf",
    }
    warnings = "\n".join(scan.warnings)
    assert "mmproj-Qwen3-VL-f16.gguf: a multimodal projector that no model in its folder matches" in warnings
    assert "mmproj-gemma-3-12b-it-f16.gguf: a multimodal projector that no model" in warnings
    assert "mmproj-gemma-3-4b-it-f16.gguf is not used for gemma-3-4b-it-Q4_K_M" in warnings


def test_a_split_written_by_gguf_is_one_model_and_placement_reads_every_shard(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    shards = write_header_only(root / "big.gguf", SyntheticModel(n_layer=3), split_max_tensors=8)
    assert len(shards) > 2
    [model] = scan_folder(root).models
    assert (model.name, model.path, model.files) == ("big", shards[0], tuple(shards))
    assert model.facts.layers == 3
    config = ConfigSource(models_dir=root).load(env={})
    [planned] = plan(config)[3]["models"]
    assert planned["verdict"] != "error", planned["message"]
    assert sum(row["weights_bytes"] for row in planned["devices"]) + planned["host_bytes"] == sum(
        t.n_bytes for t in read_header(shards[0]).tensors
    )


def test_a_missing_or_empty_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        ConfigSource(models_dir=tmp_path / "nope").load(env={})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no GGUF model found"):
        ConfigSource(models_dir=tmp_path / "empty").load(env={})


# --------------------------------------------------------------------------------------- configurations


def test_a_folder_alone_makes_one_model_per_file_on_every_gpu(tmp_path: Path) -> None:
    root = folder_of_everything(tmp_path / "models")
    env = {"ROUTER_PORT": "9123", "XDG_STATE_HOME": str(tmp_path / "state")}
    config = ConfigSource(models_dir=root).load(env=env)
    assert config.path == root
    assert list(config.models) == ["Beta-Chat", "alpha", "big", "eyes"]
    assert all(m.gpus == ALL_GPUS for m in config.models.values())
    assert config.models["alpha"].extra_args == (("mmproj", str(root / "mmproj-alpha-f16.gguf")),)
    assert config.models["big"].path == root / "big-00001-of-00002.gguf"
    assert config.router.port == 9123 and config.router.host == "127.0.0.1"
    assert config.router.replica_logs == tmp_path / "state" / "llama-router" / "logs"
    overridden = ConfigSource(models_dir=root, host="0.0.0.0", port=9999).load(env=env)
    assert (overridden.router.host, overridden.router.port) == ("0.0.0.0", 9999)
    with pytest.raises(ConfigError, match=r"--port 70000 is invalid: must be an integer between 0 and 65535"):
        ConfigSource(models_dir=root, port=70000).load(env=env)


def test_a_folder_with_a_config_file_adds_models_and_the_file_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = folder_of_everything(tmp_path / "models")
    file = tmp_path / "router.toml"
    file.write_text(
        "[router]\nport = 9200\n\n"
        '[models.alpha]\nmodel = "models/Beta Chat.gguf"\nparallel = 2\n\n'  # alpha's name, Beta's file
        '[models.eyes-too]\nmodel = "elsewhere.gguf"\naliases = ["eyes"]\n'
    )
    with caplog.at_level(logging.INFO, logger="router"):
        config = ConfigSource(file=file, models_dir=root).load(env={})
    assert config.path == file
    assert list(config.models) == ["alpha", "eyes-too", "big"]
    assert config.models["alpha"].path == root / "Beta Chat.gguf" and config.models["alpha"].parallel == 2
    assert config.router.port == 9200
    messages = [r.getMessage() for r in caplog.records]
    assert any("is not served as 'alpha': models.alpha in" in m and "the file wins" in m for m in messages)
    assert any("is not served as 'eyes': an alias of models.eyes-too" in m for m in messages)
    assert any(m.endswith("Beta Chat.gguf is already served as alpha") for m in messages)


# ---------------------------------------------------------------------------------- the router, in-process


@contextlib.asynccontextmanager
async def folder_router(tmp_path: Path, root: Path) -> AsyncIterator[Any]:
    """The router on a config file naming only the simulator, plus the models folder ``root``."""
    file = tmp_path / "router.toml"
    file.write_text(
        f'[router]\nport = {free_port()}\nllama_server = "{sim_launcher(tmp_path)}"\n'
        f'history_db = "{tmp_path / "history.db"}"\nreplica_logs = "{tmp_path / "replica-logs"}"\n'
    )
    source = ConfigSource(file=file, models_dir=root)
    async with serving_config(tmp_path, source.load(env={}), source=source) as handle:
        yield handle


async def test_models_dir_serves_the_folder_and_a_reload_rescans_it(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name, seed in (("alpha", 1), ("beta", 2)):
        write_sim_sidecar(tiny(root / f"{name}.gguf", seed), load_delay=0.05, tokens=3)
    async with folder_router(tmp_path, root) as h:
        assert [m["id"] for m in (await h.models())["data"]] == ["alpha", "beta"]
        reply = await h.client.post("/v1/chat/completions", json=chat_body("beta"))
        assert reply.status_code == 200 and reply.json()["model"] == "beta"
        [replica] = (await h.status())["replicas"]
        assert Path(replica["log_path"]).read_text().count("main: model loaded") == 1

        write_sim_sidecar(tiny(root / "gamma.gguf", 3), load_delay=0.05, tokens=3)
        (root / "alpha.gguf").unlink()
        reloaded = await h.client.post("/reload", json={})
        assert reloaded.status_code == 200, reloaded.text
        assert [m["id"] for m in (await h.models())["data"]] == ["beta", "gamma"]
        assert (await h.client.post("/v1/chat/completions", json=chat_body("gamma"))).status_code == 200
        assert (await h.client.post("/v1/chat/completions", json=chat_body("alpha"))).status_code == 404


# -------------------------------------------------------------------------------- the command line


def _env(tmp_path: Path, bin_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_", "HISTORY_DB"))}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if bin_dir is not None:
        env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    return env


async def _serve_folder(
    tmp_path: Path, root: Path, env: dict[str, str], timeout: float
) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    port = free_port()
    log_path = tmp_path / "router.log"
    with log_path.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "router", "--models-dir", str(root), "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=timeout) as client:

            async def healthy() -> bool:
                assert process.returncode is None, log_path.read_text()
                return (await client.get("/health")).status_code == 200

            await until(healthy, timeout=20, ignore=(httpx.TransportError,))
            yield client, log_path
    finally:
        process.terminate()
        with trio.move_on_after(15):
            await process.wait()
        if process.returncode is None:
            process.kill()


serve_folder = contextlib.asynccontextmanager(_serve_folder)


async def test_the_command_line_serves_a_folder_without_a_config(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name, seed in (("alpha", 1), ("Beta Chat", 2)):
        write_sim_sidecar(tiny(root / f"{name}.gguf", seed), load_delay=0.05, tokens=3)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").symlink_to(sim_launcher(tmp_path))  # found on PATH
    async with serve_folder(tmp_path, root, _env(tmp_path, bin_dir), 30.0) as (client, log_path):
        listed = (await client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in listed] == ["Beta-Chat", "alpha"]
        reply = await client.post("/v1/chat/completions", json=chat_body("Beta-Chat"))
        assert reply.status_code == 200, reply.text
        [replica] = (await client.get("/status")).json()["replicas"]
        logs = tmp_path / "state" / "llama-router" / "logs"
        assert replica["log_path"] == str(logs / f"Beta-Chat-{replica['id']}.log")
        served = await client.get(replica["log_url"])
        assert "load_tensors:" in served.text and "main: model loaded" in served.text
    router_log = log_path.read_text()
    assert "load Beta-Chat (replica 1)" in router_log and "is served as 'Beta-Chat'" in router_log
    assert "load_tensors:" not in router_log and "main: model loaded" not in router_log  # replica lines
    assert "HTTP Request:" not in router_log  # nor every forwarded request


def test_init_prints_a_config_that_loads_and_plans(tmp_path: Path) -> None:
    root = tmp_path / "models"
    tiny(root / "alpha.gguf", 1)
    tiny(root / "Beta Chat.gguf", 2)
    tiny(root / "Qwen2.5-mini.gguf", 4)  # a name TOML must quote
    projector(root / "mmproj-alpha-f16.gguf", 64)
    tiny(root / "big-00001-of-00002.gguf", 3)
    (root / "big-00002-of-00002.gguf").write_bytes(b"shard")
    env = _env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "router", "init", "--models-dir", str(root)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    data = tomllib.loads(text)
    assert data["router"] == {}  # every [router] key is commented out
    assert "# max_models_per_gpu = 1" in text and '# host = "127.0.0.1"' in text
    assert set(data["models"]) == {"alpha", "Beta-Chat", "Qwen2.5-mini", "big"}
    assert '[models."Qwen2.5-mini"]' in text
    assert data["models"]["alpha"] == {
        "model": str(root / "alpha.gguf"),
        "gpus": [0],
        "mmproj": str(root / "mmproj-alpha-f16.gguf"),
    }
    assert data["models"]["big"]["model"] == str(root / "big-00001-of-00002.gguf")
    assert "# header: architecture llama, 2 layers, trained context 2048" in text
    assert "in 2 files" in text and "# plan: unknown-budget, context 2048" in text
    config = tmp_path / "router.toml"
    config.write_text(text)
    planned = subprocess.run(
        [sys.executable, "-m", "router", "plan", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "alpha" in planned.stdout and "Beta-Chat" in planned.stdout


def test_init_needs_a_folder_with_models(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for argv, message in (
        (["init"], "init needs --models-dir DIR"),
        (["init", "--models-dir", str(tmp_path / "empty")], "no GGUF model found"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "router", *argv],
            capture_output=True,
            text=True,
            env=_env(tmp_path),
            cwd=REPO,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr


# ------------------------------------------------------------------------------------------------- real


@pytest.mark.real
async def test_the_command_line_serves_a_folder_with_the_real_llama_server(tmp_path: Path) -> None:
    """The first-run path: a folder, no config, the installed llama-server; a streamed reply."""
    binary = require_llama_server()
    root = tmp_path / "models"
    tiny(root / "tiny-chat.gguf", 1)
    env = _env(tmp_path, binary.parent)
    with trio.fail_after(120):
        async with serve_folder(tmp_path, root, env, 60.0) as (client, log_path):
            body = {**chat_body("tiny-chat"), "max_tokens": 4, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                chunks = [line async for line in response.aiter_lines() if line.startswith("data: ")]
            assert chunks[-1] == "data: [DONE]" and len(chunks) >= 3
            [replica] = (await client.get("/status")).json()["replicas"]
            log = Path(replica["log_path"])
            # llama-server prints the request's timings just after its last chunk.
            await until(lambda: "print_timing" in log.read_text(), what="the request's timings in the log")
            assert "load_model: loading model" in log.read_text()
    assert "load_model: loading model" not in log_path.read_text()
