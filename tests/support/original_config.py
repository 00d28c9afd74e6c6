"""A configuration pair in the original llama-router's format (config.json + presets.ini), as a homelab
with two GPUs might write it: three models, prompt-cache and cache-type globals, scheduler timings.

``write_original_pair`` writes it into a folder with the model paths, the llama-server binary and the
ports given, so tests can point it at tiny generated models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def original_config_json(
    *, port: int = 11434, binary: str = "/opt/llama.cpp/bin/llama-server", num_gpus: int | None = 2
) -> dict[str, Any]:
    router: dict[str, Any] = {
        "HEALTH_CHECK_INTERVAL": 0.5,
        "HEALTH_CHECK_TIMEOUT": 20.0,
        "UNLOAD_POLL_INTERVAL": 0.25,
        "UNLOAD_POLL_TIMEOUT": 30.0,
        "LOAD_POLL_INTERVAL": 0.5,
        "LOAD_POLL_TIMEOUT": 90.0,
        "START_RETRIES": 2,
        "GRACEFUL_KILL_TIMEOUT": 4.0,
        "MAX_MODELS_PER_GPU": 2,
        "EVICTION_POLICY": "FIFO",
        "QUEUE_HEAD_GRACE": 1.5,
        "QUEUE_FORCE_LOAD_TIMEOUT": 240,
    }
    if num_gpus is not None:
        router["NUM_GPUS"] = num_gpus
    return {
        "LLM": {
            "chat-small": {
                "num_instance": 2,
                "gpus": [0],
                "reasoning_effort": {
                    "options": ["low", "medium", "high"],
                    "default": "medium",
                    "disable": "none",
                },
                "cost": {"input": 0.2, "cached_input": 0.05, "output": 0.8},
            },
            "coder": {"num_instance": 1, "gpus": "all", "reasoning_effort": ["minimal", "high"]},
            "embedder": {"num_instance": 1, "gpus": 1},
        },
        "ROUTER": router,
        "API-port": port,
        "LLM-base-port": 31000,
        "llama-server-executable": binary,
    }


def original_presets_ini(models: Mapping[str, str], *, threads: int | None = None) -> str:
    """The presets.ini text; ``models`` maps chat-small, coder and embedder to their GGUF files."""
    extra = f"threads = {threads}\n" if threads is not None else ""
    return (
        "; llama.cpp settings shared by every model\n"
        "[*]\n"
        "jinja = true\n"
        "fa = on\n"
        "ngl = 99\n"
        "ctk = q8_0\n"
        "ctv = q8_0\n"
        "cram = 2048\n"
        "cache-prompt = true\n"
        f"{extra}"
        "\n"
        "[chat-small]\n"
        f"model = {models['chat-small']}\n"
        "c = 4096\n"
        "b = 512\n"
        "parallel = 2\n"
        "device = CUDA0\n"
        "\n"
        "[coder]\n"
        f"m = {models['coder']}\n"
        "c = 2048\n"
        "cram = 512\n"
        "temp = 0.2\n"
        "\n"
        "# an embedding model on the second card\n"
        "[embedder]\n"
        f"model = {models['embedder']}\n"
        "c = 2048\n"
        "embeddings = true\n"
        "port = 39999\n"
    )


def write_original_pair(
    folder: Path,
    models: Mapping[str, str],
    *,
    port: int = 11434,
    binary: str = "/opt/llama.cpp/bin/llama-server",
    num_gpus: int | None = 2,
    threads: int | None = None,
    router_extra: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write config.json and presets.ini into ``folder``; return their paths."""
    doc = original_config_json(port=port, binary=binary, num_gpus=num_gpus)
    doc["ROUTER"].update(router_extra or {})
    config = folder / "config.json"
    presets = folder / "presets.ini"
    config.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    presets.write_text(original_presets_ini(models, threads=threads), encoding="utf-8")
    return config, presets
