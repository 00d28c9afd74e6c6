"""Headless Chromium for the browser tier: finding it, running it, and a router with GGUF models to point it
at."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import trio

from router.placement.synthetic import SyntheticModel
from tests.support import REPO
from tests.support.harness import RouterHandle, running_router

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


# The simulator's behaviour for these models unless a table says otherwise: slower loads and longer replies
# than the harness's defaults, so that the dashboard has loads and streams to show.
GGUF_SIM: Mapping[str, Any] = {"load_delay": 0.3, "tokens": 24, "token_rate": 200.0}


def gguf_models(models: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``models`` as header-only GGUF models: a table without a ``shape`` takes its name's from
    :data:`SHAPES` (else a default :class:`SyntheticModel`), and its ``sim`` keys go over :data:`GGUF_SIM`."""
    tables = {}
    for name, raw in models.items():
        table = dict(raw)
        table.setdefault("shape", SHAPES.get(name, SyntheticModel()))
        table["sim"] = {**GGUF_SIM, **table.get("sim", {})}
        tables[name] = table
    return tables


@contextlib.asynccontextmanager
async def gguf_router(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
) -> AsyncIterator[RouterHandle]:
    """:func:`~tests.support.harness.running_router` on :func:`gguf_models` of ``models``."""
    async with running_router(dir, gguf_models(models), router=router, devices=devices) as handle:
        yield handle


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
