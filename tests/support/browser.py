"""Headless Chromium for the browser tier: finding it, running it, and a router with GGUF models to point it
at."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from router.config.load import config_from_dict
from router.placement.synthetic import SyntheticModel
from router.serve.server import build_router, run_server
from router.shell.ports import free_port
from router.shell.runtime import Router
from tests.support import REPO
from tests.support.simtools import sim_launcher, write_sim_gguf

OUTPUTS = REPO / "outputs"
REQUIRE_BROWSER_ENV = "LLAMA_ROUTER_REQUIRE_BROWSER"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")


def find_browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    message = "the dashboard test needs Chromium: apt-get install -y chromium"
    if os.environ.get(REQUIRE_BROWSER_ENV) == "1":
        pytest.fail(
            f"{message} ({REQUIRE_BROWSER_ENV}=1 makes this a failure instead of a skip)", pytrace=False
        )
    pytest.skip(message)


SHAPES: Mapping[str, SyntheticModel] = {
    "llama-8b": SyntheticModel(
        n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=32000, weight_type="q4_k"
    ),
    "mistral-7b": SyntheticModel(
        n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=11008, n_vocab=32000, weight_type="q4_k"
    ),
    "qwen-14b": SyntheticModel(
        n_layer=40, n_embd=5120, n_head=40, n_head_kv=8, n_ff=13824, n_vocab=32000, weight_type="q4_k"
    ),
    "phi-mini": SyntheticModel(
        n_layer=32, n_embd=3072, n_head=32, n_head_kv=32, n_ff=8192, n_vocab=32000, weight_type="q4_k"
    ),
}


def gguf_model(dir: Path, name: str, shape: SyntheticModel, **behaviour: Any) -> Path:
    """A header-only GGUF of ``shape`` whose simulated replica behaves as ``behaviour`` says."""
    return write_sim_gguf(dir, name, shape, name=name, **behaviour)


@contextlib.asynccontextmanager
async def gguf_router(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
) -> AsyncIterator[tuple[str, Router, httpx.AsyncClient]]:
    """The real router (run_server) on ``models``: each value is a ``[models.NAME]`` table whose ``shape``
    and ``sim`` keys say how to write the model file."""
    tables = {}
    for name, raw in models.items():
        table = dict(raw)
        shape = table.pop("shape", SHAPES.get(name, SyntheticModel()))
        sim = {"load_delay": 0.3, "tokens": 24, "token_rate": 200.0, **table.pop("sim", {})}
        table["model"] = str(gguf_model(dir / "models", name, shape, **sim))
        tables[name] = table
    doc: dict[str, Any] = {
        "router": {
            "host": "127.0.0.1",
            "port": free_port(),
            "llama_server": str(sim_launcher(dir)),
            "history_db": str(dir / "history.db"),
            "replica_logs": str(dir / "replica-logs"),
            "load_timeout": 20.0,
            "stop_timeout": 3.0,
            **(router or {}),
        },
        "models": tables,
    }
    if devices:
        doc["devices"] = dict(devices)
    config = config_from_dict(doc, dir / "router.json")
    the_router = build_router(config)
    url = f"http://127.0.0.1:{config.router.port}"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(run_server, config, router=the_router))
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            with trio.fail_after(15):
                while True:
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get("/health")).status_code == 200:
                            break
                    await trio.sleep(0.02)
            try:
                yield url, the_router, client
            finally:
                nursery.cancel_scope.cancel()


class _Elements(HTMLParser):
    """Every element of a document as (tag, attributes), in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def elements(html: str, tag: str, **attrs: str) -> list[dict[str, str]]:
    """Elements named ``tag`` whose attributes hold ``attrs`` (``class_`` matches one of the classes)."""
    parser = _Elements()
    parser.feed(html)
    out = []
    for name, have in parser.found:
        if name != tag:
            continue
        ok = True
        for key, want in attrs.items():
            if key == "class_":
                ok = ok and want in have.get("class", "").split()
            else:
                ok = ok and have.get(key.replace("_", "-")) == want
        if ok:
            out.append(have)
    return out


async def chromium(browser: str, *args: str, timeout: float = 90.0) -> bytes:
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        "--mute-audio",
        *args,
    ]
    with trio.fail_after(timeout):
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return bytes(done.stdout)
