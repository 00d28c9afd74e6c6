"""The dashboard's live logs in headless Chromium: a loading replica's log opens by itself and shows its lines
as the replica writes them, and closes once it is ready; any replica's log opens with its "live" button, and
closing the pane ends the stream on the router.

Without Chromium the test is skipped, unless ``LLAMA_ROUTER_REQUIRE_BROWSER=1``, which makes it fail.
"""

from __future__ import annotations

from pathlib import Path

import trio

from statemachine.queries import replicas_of
from tests.support.browser import find_browser
from tests.support.cdp import open_page
from tests.support.client import chat_body, post_chat, start_post
from tests.support.harness import running_router
from tests.support.waiting import until

PANE = "document.querySelector('.log-pane[data-replica=\"{id}\"]')"


def pane_text(replica: int) -> str:
    pane = PANE.format(id=replica)
    return f"({pane} ? {pane}.querySelector('.log-lines').textContent : null)"


async def test_a_loading_replicas_log_shows_live_and_its_pane_closes_when_ready(tmp_path: Path) -> None:
    browser = find_browser()
    models = {"slow": {"sim": {"load_delay": 10.0}}}  # time enough on a busy machine to see it load
    async with (
        running_router(tmp_path, models, router={"api_keys": ["s3cret"]}) as h,
        open_page(browser, f"{h.url}/dash") as page,
        trio.open_nursery() as nursery,
    ):
        await page.evaluate("localStorage.setItem('llama-router-key', 's3cret')")
        await page.goto(f"{h.url}/dash")  # again, now with the key
        await page.wait_for("document.body?.dataset.ready === '1'")
        assert await page.evaluate("document.querySelectorAll('.log-pane').length") == 0
        h.client.headers["authorization"] = "Bearer s3cret"
        pending = start_post(nursery, h.client, chat_body("slow", max_tokens=2))
        state = await h.wait_state(lambda s: any(r.phase == "loading" for r in replicas_of(s, "slow")))
        [replica] = [r.id for r in replicas_of(state, "slow")]
        text = pane_text(replica)
        await page.wait_for(f"({text} || '').includes('load_model: loading model')")
        # Shown while the replica still loads (it takes seconds), with the router's own first line.
        assert [r.phase for r in replicas_of(h.router.state, "slow")] == ["loading"]
        shown = await page.evaluate(text)
        assert shown.startswith("--- ") and "main: model loaded" not in shown
        await pending.done.wait()
        # Ready: the pane that opened by itself goes away, and its stream with it.
        await page.wait_for(f"{PANE.format(id=replica)} === null")
        file = h.router.supervisor.log_file(replica)
        assert file is not None
        await until(lambda: file.feed.followers == 0, what="the dashboard's stream closed")

        # Any replica's log opens with its button and follows new lines until the pane is closed.
        await page.evaluate(f"document.querySelector('button.follow[data-replica=\"{replica}\"]').click()")
        await page.wait_for(f"({text} || '').includes('main: model loaded')")
        await until(lambda: file.feed.followers == 1, what="the dashboard following")
        assert (await post_chat(h.client, "slow", max_tokens=2)).status_code == 200
        await page.wait_for(f"({text} || '').includes('launch_slot_')")
        await page.evaluate(f"{PANE.format(id=replica)}.querySelector('.log-close').click()")
        await page.wait_for(f"{PANE.format(id=replica)} === null")
        await until(lambda: file.feed.followers == 0, what="the closed pane's stream ended")
    assert pending.response is not None and pending.response.status_code == 200
