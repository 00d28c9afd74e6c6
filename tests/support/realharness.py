"""Run the router in-process against the REAL llama-server binary on tiny generated models.

The router spawns llama-server exactly as in production (same argv builder, masking, health probe); only
the models are tiny and random, and every replica is held to one CPU thread so tests stay predictable on a
small machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from router.cli.tinymodel import TinyShape
from router.shell.ports import free_port
from tests.support.harness import RouterHandle, serving
from tests.support.realenv import require_llama_server, tiny_model
from tests.support.routerproc import RouterProcess, process_serving

SHAPES = {
    "small": TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, seed=1),
    "other": TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=1, n_ff=128, seed=2),
    "wide": TinyShape(n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=256, seed=3),
}


def real_model(shape: str = "small") -> str:
    return str(tiny_model(SHAPES[shape]))


@contextlib.asynccontextmanager
async def real_router(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
) -> AsyncIterator[RouterHandle]:
    """The router on real llama-server replicas of ``models`` (each table may name a ``shape``)."""
    doc = real_document(dir, models, router=router, pools=pools, devices=devices)
    async with serving(dir, doc, client_timeout=120.0) as handle:
        yield handle


@contextlib.asynccontextmanager
async def real_router_process(
    dir: Path, models: Mapping[str, Mapping[str, Any]], *, router: Mapping[str, Any] | None = None
) -> AsyncIterator[RouterProcess]:
    """``python -m router`` in a process of its own, on real llama-server replicas of ``models``."""
    async with process_serving(dir, real_document(dir, models, router=router)) as handle:
        yield handle


def real_document(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The configuration document for real llama-server replicas of ``models``."""
    binary = require_llama_server()
    tables = {}
    for name, raw in models.items():
        table = dict(raw)
        table["model"] = real_model(table.pop("shape", "small"))
        table.setdefault("ctx", 2048)
        # The CPU build lists no device, so models that name no GPUs would run on the CPU (see
        # router.deploy.cpu_host); these tests schedule on GPU 0 as on a GPU host. None leaves gpus unset.
        if table.setdefault("gpus", [0]) is None:
            del table["gpus"]
        tables[name] = table
    doc: dict[str, Any] = {
        "router": {
            "host": "127.0.0.1",
            "port": free_port(),
            "llama_server": str(binary),
            "history_db": str(dir / "history.db"),
            "load_timeout": 60.0,
            "stop_timeout": 5.0,
            "queue_force_load_timeout": 3600.0,
            **(router or {}),
        },
        "defaults": {"threads": 1, "metrics": True},
        "models": tables,
    }
    if pools:
        doc["pools"] = dict(pools)
    if devices:
        doc["devices"] = dict(devices)
    return doc


def long_body(model: str, tokens: int, text: str = "Once upon a time") -> dict[str, Any]:
    """A request that generates exactly ``tokens`` tokens (end-of-sequence ignored)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
