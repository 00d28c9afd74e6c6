"""The router's own pages in headless Chromium, driven through the DevTools protocol (tests.support.cdp):
/translate streams a translation and stops one, /chat lists models and replicas and opens the right chat
for each ready replica, /talk holds a conversation, and /dash shows each model's placement verdict.

Screenshots go to ``outputs/`` (translate, translate-phone, chat, talk). Without Chromium the tests skip,
unless ``LLAMA_ROUTER_REQUIRE_BROWSER=1``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.support.browser import OUTPUTS, SHAPES, find_browser, gguf_router
from tests.support.cdp import Page, open_page
from tests.support.client import chat_body
from tests.support.harness import RouterHandle, running_router

REPLY = "Bonjour tout le monde, voici une traduction simulée qui arrive mot par mot"


def js(value: Any) -> str:
    return json.dumps(value)


async def fill(page: Page, values: dict[str, str]) -> None:
    for element, value in values.items():
        await page.evaluate(f"document.getElementById({js(element)}).value = {js(value)}")


async def history(h: RouterHandle, model: str) -> list[dict[str, Any]]:
    rows = (await h.client.get("/history", params={"model": model})).json()["rows"]
    return [r for r in rows if r["endpoint"] == "/v1/chat/completions"]


async def no_horizontal_scroll(page: Page, width: int) -> None:
    await page.viewport(width, 800, mobile=True)
    await page.wait_for(f"window.innerWidth === {width}")  # reading scrollWidth then lays the page out anew
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= width, f"the page is {wide} px wide in a {width} px viewport"


async def test_translate_streams_a_translation_and_stop_aborts_one(tmp_path: Path) -> None:
    browser = find_browser()
    models = {
        "alpha": {"gpus": [0], "sim": {"reply": REPLY, "tokens": len(REPLY.split()), "token_rate": 20.0}},
        "slow": {"gpus": [1], "sim": {"tokens": 2000, "token_rate": 10.0}},
    }
    async with (
        running_router(tmp_path, models, router={"num_gpus": 2}) as h,
        open_page(browser, f"{h.url}/translate") as page,
    ):
        await page.wait_for("document.body?.dataset.ready === '1'")
        options = await page.evaluate("[...document.querySelectorAll('#model option')].map(o => o.value)")
        assert options == ["alpha", "slow"]
        languages = await page.evaluate("document.querySelectorAll('#languages option').length")
        assert languages >= 10
        await fill(page, {"model": "alpha", "target": "Old Norse", "source": "Hello everybody"})
        await page.evaluate("document.getElementById('go').click()")
        # Pieces appear while the reply is still being generated, then the whole reply is there.
        await page.wait_for("Number(document.getElementById('output').dataset.pieces || 0) >= 2")
        assert await page.evaluate("document.getElementById('state').dataset.state") == "running"
        await page.wait_for("document.getElementById('state').dataset.state === 'done'")
        text = await page.evaluate("document.getElementById('output').textContent")
        assert text.split() == REPLY.split()
        assert int(await page.evaluate("document.getElementById('output').dataset.pieces")) >= 10
        (row,) = await history(h, "alpha")
        assert row["status"] == 200 and row["stream"] is True

        # Stop: the fetch is aborted, the text stops growing and the router sees the client leave.
        await fill(page, {"model": "slow", "source": "A long text"})
        await page.evaluate("document.getElementById('go').click()")
        await page.wait_for("Number(document.getElementById('output').dataset.pieces || 0) >= 3")
        assert await page.evaluate("!document.getElementById('stop').disabled")
        await page.evaluate("document.getElementById('stop').click()")
        await page.wait_for("document.getElementById('state').dataset.state === 'stopped'")
        shown = await page.evaluate("document.getElementById('output').textContent")
        # Once the router has let the request go, no byte of it is on its way; a task of the page's after
        # that has seen whatever was.
        await h.wait_idle()
        await page.evaluate("new Promise(resolve => setTimeout(resolve, 0))")
        assert await page.evaluate("document.getElementById('output').textContent") == shown
        assert 3 <= len(shown.split()) < 100
        (left,) = await history(h, "slow")
        assert left["status"] == 499
        assert await page.evaluate("document.getElementById('go').disabled") is False

        OUTPUTS.mkdir(exist_ok=True)
        await page.screenshot(OUTPUTS / "translate.png")
        await no_horizontal_scroll(page, 375)
        await page.screenshot(OUTPUTS / "translate-phone.png")
        links = await page.evaluate("[...document.querySelectorAll('.pages-nav a')].map(a => a.pathname)")
        assert {"/dash", "/chat", "/translate"} <= set(links)


ROWS = """[...document.querySelectorAll('tr.replica')].map(r => ({
  model: r.dataset.model, state: r.dataset.state,
  kind: r.querySelector('a.open') ? r.querySelector('a.open').dataset.kind : null,
  href: r.querySelector('a.open') ? r.querySelector('a.open').href : null}))"""


async def test_chat_index_lists_replicas_and_opens_web_ui_or_our_chat(tmp_path: Path) -> None:
    browser = find_browser()
    models = {
        "webby": {"gpus": [0], "sim": {"web_ui": True}},
        "plain": {"gpus": [1], "sim": {"tokens": 6}},
        "cold": {"gpus": [2]},
        "later": {"gpus": [3], "sim": {"load_delay": 30.0}},
    }
    async with running_router(tmp_path, models, router={"num_gpus": 4}) as h:
        for model in ("webby", "plain"):
            assert (await h.client.post("/v1/chat/completions", json=chat_body(model))).status_code == 200
        async with trio.open_nursery() as nursery:

            async def load_later() -> None:
                await h.client.post("/v1/chat/completions", json=chat_body("later"))

            nursery.start_soon(load_later)
            await h.wait_state(lambda s: any(r.model == "later" for r in s.replicas))

            async with open_page(browser, f"{h.url}/chat") as page:
                await page.wait_for("document.querySelectorAll('tr.replica a.open').length === 2")
                rows = {r["model"]: r for r in await page.evaluate(ROWS)}
                assert set(rows) == {"webby", "plain", "later"}
                assert rows["webby"]["state"] == "ready" and rows["webby"]["kind"] == "webui"
                assert rows["webby"]["href"] == f"{h.url}/chat/webby/"
                assert rows["plain"]["state"] == "ready" and rows["plain"]["kind"] == "talk"
                assert rows["plain"]["href"] == f"{h.url}/talk?model=plain"
                assert rows["later"]["state"] == "loading" and rows["later"]["kind"] is None
                states = await page.evaluate(
                    "Object.fromEntries([...document.querySelectorAll('section.model')]"
                    ".map(s => [s.dataset.model, s.querySelector('.model-state').textContent]))"
                )
                assert states == {"webby": "ready", "plain": "ready", "cold": "unloaded", "later": "loading"}
                OUTPUTS.mkdir(exist_ok=True)
                await page.screenshot(OUTPUTS / "chat.png")
                await no_horizontal_scroll(page, 375)

                # The replica with a web UI: the link opens llama-server's page through the router.
                await page.goto(rows["webby"]["href"])
                assert await page.wait_for("document.title") == "llama.cpp (simulated)"

                # The one without: our chat, with the model chosen, streaming replies in a conversation.
                await page.viewport(1280, 900)
                await page.goto(rows["plain"]["href"])
                await page.wait_for("document.body?.dataset.ready === '1'")
                assert await page.evaluate("document.getElementById('model').value") == "plain"
                for n, prompt in enumerate(("hello there", "and again"), start=1):
                    await fill(page, {"prompt": prompt})
                    await page.evaluate("document.getElementById('send').click()")
                    await page.wait_for("document.getElementById('state').dataset.state === 'done'")
                    replies = await page.evaluate(
                        "[...document.querySelectorAll('.msg[data-role=assistant] .text')]"
                        ".map(e => e.textContent)"
                    )
                    assert len(replies) == n and len(replies[-1].split()) == 6
                    await page.evaluate("document.getElementById('state').dataset.state = 'idle'")
                await page.screenshot(OUTPUTS / "talk.png")
                await no_horizontal_scroll(page, 375)
            nursery.cancel_scope.cancel()
        rows_plain = await history(h, "plain")
        assert [r["stream"] for r in reversed(rows_plain)] == [False, True, True]
        assert all(r["status"] == 200 for r in rows_plain)


async def test_dash_shows_each_models_plan_verdict_and_links_the_pages(tmp_path: Path) -> None:
    browser = find_browser()
    models = {
        "llama-8b": {"gpus": [0]},
        "qwen-14b": {"gpus": [0], "ctx": 8192},
        "huge": {"gpus": [0], "shape": attrs.evolve(SHAPES["qwen-14b"], n_layer=400)},
        "blind": {"gpus": [1]},
    }
    devices = {"0": {"memory_mib": 16384}}
    async with gguf_router(tmp_path, models, router={"num_gpus": 2}, devices=devices) as h:
        plan = {m["name"]: m for m in (await h.client.get("/plan")).json()["models"]}
        async with open_page(browser, f"{h.url}/dash") as page:
            await page.wait_for("document.getElementById('plan').dataset.ready === '1'")
            shown = await page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('#plan li.plan-row')]"
                ".map(li => [li.dataset.model,"
                " [li.dataset.verdict, li.querySelector('.verdict').textContent]]))"
            )
            links = await page.evaluate("[...document.querySelectorAll('.pages-nav a')].map(a => a.pathname)")
            loadable = await page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('#plan li.plan-row')]"
                ".map(li => [li.dataset.model, !li.querySelector('button[data-action=load]').disabled]))"
            )
    assert {"/chat", "/translate"} <= set(links)
    assert loadable == {"llama-8b": True, "qwen-14b": True, "huge": False, "blind": True}  # refused: no load
    assert set(shown) == set(models)
    verdict, words = shown["llama-8b"]
    assert verdict == plan["llama-8b"]["verdict"] == "fits"
    assert words.startswith(f"fits on GPU 0 at {plan['llama-8b']['ctx'] // 1024}k"), words
    assert shown["qwen-14b"][0] == "override" and "on GPU 0 at 8k" in shown["qwen-14b"][1]
    verdict, words = shown["huge"]
    assert verdict == "refused" and words == "refused: " + plan["huge"]["message"]
    verdict, words = shown["blind"]
    assert verdict == "unknown-budget" and words == "unknown budget: " + plan["blind"]["message"]


async def test_dash_load_and_unload_buttons_ask_the_router_with_the_dashboards_key(tmp_path: Path) -> None:
    browser = find_browser()
    models = {"a": {"sim": {"load_delay": 0.3}}, "b": {"gpus": [1], "sim": {}}}
    router = {"num_gpus": 2, "api_keys": ["s3cret"]}
    async with (
        running_router(tmp_path, models, router=router) as h,
        open_page(browser, f"{h.url}/dash") as page,
    ):
        await page.wait_for("!document.getElementById('key-form').hidden")  # 401 without the key
        await fill(page, {"key-input": "s3cret"})
        await page.evaluate("document.getElementById('key-form').requestSubmit()")
        await page.wait_for("document.getElementById('plan').dataset.ready === '1'")
        row = "document.querySelector('#plan li.plan-row[data-model=\"a\"]')"
        said = f"{row}.querySelector('.action-said')"
        await page.evaluate(f"{row}.querySelector('button[data-action=load]').click()")
        await h.wait_state(lambda s: [r.phase for r in s.replicas if r.model == "a"] == ["ready"])
        assert await page.wait_for(f"{said}.dataset.state === 'done' && {said}.textContent") == "load asked"
        await page.evaluate(f"{row}.querySelector('button[data-action=unload]').click()")
        await h.wait_state(lambda s: not s.replicas)
        assert await page.wait_for(f"{said}.textContent === 'unload asked'")
        assert [r.model for r in h.router.state.replicas] == []
        await page.evaluate("localStorage.setItem('llama-router-key', 'wrong')")
        await page.evaluate(f"{row}.querySelector('button[data-action=load]').click()")
        await page.wait_for(f"{said}.dataset.state === 'failed'")
        assert await page.evaluate("!document.getElementById('key-form').hidden")
    assert not h.router.state.replicas  # the refused click loaded nothing
