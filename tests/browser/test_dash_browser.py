"""The dashboard in headless Chromium, against a router whose replicas are simulated llama-servers.

The models are header-only GGUF files of realistic shapes (the simulator takes its behaviour from a sidecar
file), so placement predicts real memory needs and the GPU timeline has something to draw. After some
traffic (loads, an eviction, a failed load, a 404, a cancelled stream) the page is loaded; once its
scripts ran, the DOM must hold the GPU timeline, residency and history with that data. Screenshots go to
``outputs/dashboard.png`` (desktop) and ``outputs/dashboard-phone.png``.

Without Chromium the test is skipped, unless ``LLAMA_ROUTER_REQUIRE_BROWSER=1``, which makes it fail.
Debian/Ubuntu: ``apt-get install -y chromium`` (pulls in chromium-common and chromium-sandbox).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import trio

from router.shell.ports import free_port
from router.shell.runtime import Router
from tests.support.browser import OUTPUTS, SHAPES, chromium, elements, find_browser, gguf_router
from tests.support.client import chat_body, stream
from tests.support.harness import RouterHandle, running_router
from tests.support.waiting import until

# Shapes close to well-known 7-14B models at 4-bit; the files hold headers only.


async def sampled(client: httpx.AsyncClient, holds: Callable[[list[list[str]]], bool]) -> bool:
    """Whether the GPU sampler's latest sample of GPU 0's residents (``[model, state]`` pairs) ``holds``."""
    residents = (await client.get("/dash/timeline")).json()["gpus"][0]["residents"]
    return bool(residents) and holds(residents[-1])


async def sampled_since(client: httpx.AsyncClient, since: float) -> bool:
    """Whether the GPU sampler took a sample after the wall-clock time ``since``."""
    return any(at > since for at in (await client.get("/dash/timeline")).json()["t"])


async def make_traffic(client: httpx.AsyncClient, router: Router) -> None:
    """Loads on two GPUs, an eviction on GPU 0, a failed load, a 404, a 503 and a client that leaves."""
    for model in ("llama-8b", "qwen-14b"):
        reply = await client.post("/v1/chat/completions", json=chat_body(model, "tell me about GPUs"))
        assert reply.status_code == 200
    streamed = await stream(
        client, "/v1/chat/completions", chat_body("mistral-7b", "a streamed reply please")
    )
    assert streamed.status == 200 and streamed.done
    # The sampler sees this residency before the swap.
    await until(lambda: sampled(client, lambda gpu0: ["mistral-7b", "ready"] in gpu0), timeout=20)
    reply = await client.post("/v1/chat/completions", json=chat_body("phi-mini", "this one evicts"))
    assert reply.status_code == 200
    left = await stream(client, "/v1/chat/completions", chat_body("qwen-14b", "long"), drop_after=3)
    assert left.dropped
    missing = await client.post("/v1/chat/completions", json=chat_body("no-such-model"))
    assert missing.status_code == 404
    broken = await client.post("/v1/chat/completions", json=chat_body("broken-70b"))
    assert broken.status_code == 503
    await client.post("/v1/completions", json={"model": "llama-8b", "prompt": "once upon a time"})


async def test_dashboard_shows_timeline_residency_and_history(tmp_path: Path) -> None:
    browser = find_browser()
    models = {
        "llama-8b": {"gpus": [0]},
        "mistral-7b": {"gpus": [0]},
        "phi-mini": {"gpus": [0]},
        "qwen-14b": {"gpus": [1], "parallel": 2},
        "broken-70b": {"gpus": [1], "shape": SHAPES["mistral-7b"], "sim": {"oom_at_load": True}},
    }
    router = {"num_gpus": 2, "max_models_per_gpu": 2}
    devices = {"0": {"memory_mib": 16384}, "1": {"memory_mib": 16384}}
    async with gguf_router(tmp_path, models, router=router, devices=devices) as h:
        await make_traffic(h.client, h.router)
        changed = time.time()  # one more sample after the last change:
        await until(lambda: sampled_since(h.client, changed), timeout=20)
        answered = (await h.client.get("/history", params={"limit": 1000, "status": "ok"})).json()["rows"]
        usage = (await h.client.get("/usage")).json()["keys"]
        dom = (await chromium(browser, "--virtual-time-budget=6000", "--dump-dom", f"{h.url}/dash")).decode()
        OUTPUTS.mkdir(exist_ok=True)
        for name, size in (("dashboard.png", "1280,1720"), ("dashboard-phone.png", "390,2400")):
            (OUTPUTS / name).unlink(missing_ok=True)
            await chromium(
                browser,
                f"--window-size={size}",
                "--virtual-time-budget=6000",
                f"--screenshot={OUTPUTS / name}",
                f"{h.url}/dash",
            )
            assert (OUTPUTS / name).stat().st_size > 10_000

    assert elements(dom, "body", data_ready="1"), "the page's scripts did not finish a first refresh"
    # The GPU timeline: one chart per GPU, with predicted memory drawn from several samples.
    for gpu in ("0", "1"):
        assert len(elements(dom, "svg", class_="timeline", data_gpu=gpu)) == 1
    predicted = elements(dom, "path", class_="line-predicted")
    assert len(predicted) == 2 and all(int(p["data-points"]) >= 3 for p in predicted)
    assert all(p["d"].count("V") >= 1 for p in predicted)
    # Residency over time: lanes for the models that were resident, and residency now as chips.
    lanes = {e["data-model"] for e in elements(dom, "rect", class_="lane")}
    assert {"llama-8b", "mistral-7b", "phi-mini", "qwen-14b"} <= lanes
    now = {
        (e["data-model"], e["data-state"]) for e in elements(dom, "span", class_="chip") if "data-state" in e
    }
    assert ("phi-mini", "ready") in now and ("qwen-14b", "ready") in now
    assert len([m for m, _ in now if m in ("llama-8b", "mistral-7b", "phi-mini")]) == 2
    # Each replica's chip and table row link to its llama-server log.
    links = [e["href"] for e in elements(dom, "a", class_="log")]
    assert len(links) >= 4 and all(link.startswith("/logs/") for link in links)
    # Loads, the eviction and the failed load.
    kinds = {e["data-kind"] for e in elements(dom, "li", class_="event")}
    assert {"load", "ready", "stop", "load_failed"} <= kinds
    # The history table holds every request, failures included.
    statuses = [e["data-status"] for e in elements(dom, "tr", class_="hist-row")]
    assert statuses.count("200") == 5 and {"404", "503", "499"} <= set(statuses), statuses
    assert len(statuses) == 8
    # The prompt cache chart: per model that answered, its share over time from the same history rows.
    assert len(elements(dom, "svg", class_="cache-chart")) == 1
    lines = {e["data-model"]: e for e in elements(dom, "path", class_="line-cache")}
    served = {r["model_served"] for r in answered if r["prompt_tokens"] and r["cached_tokens"] is not None}
    assert set(lines) == served and {"llama-8b", "mistral-7b", "phi-mini", "qwen-14b"} <= served
    for model, line in lines.items():
        rows = [r for r in answered if r["model_served"] == model and r["prompt_tokens"]]
        assert int(line["data-prompt"]) == sum(r["prompt_tokens"] for r in rows) > 0
        assert int(line["data-cached"]) == sum(r["cached_tokens"] for r in rows)
        assert int(line["data-points"]) >= 1 and line["d"].startswith("M")
    assert len(elements(dom, "circle", class_="dot-cache")) >= len(served)
    shares = {e["data-model"] for e in elements(dom, "span", class_="cache-share")}
    assert shares == served
    # Usage by key: every request here was anonymous, the 404 and the 503 included.
    usage_rows = elements(dom, "tr", class_="usage-row")
    assert [(e["data-key"], int(e["data-requests"])) for e in usage_rows] == [("", usage[""]["requests"])]
    assert usage[""]["requests"] == 8 and usage[""]["errors"] == 3


# ---------------------------------------------------------------------------------------------------------
# /chat/{model}: the replica's own web UI through the router (no browser needed)


async def test_chat_page_loads_the_model_on_demand_and_passes_through(tmp_path: Path) -> None:
    models = {"alpha": {"aliases": ["a"], "sim": {"tokens": 4, "load_delay": 0.3}}}
    async with running_router(tmp_path, models) as h:
        assert not h.router.state.replicas
        bare = await h.client.get("/chat/a")
        assert bare.status_code == 308 and bare.headers["location"] == "a/"
        props = await h.client.get("/chat/a/props")  # nothing loaded: admitted, loaded, then passed through
        assert props.status_code == 200, props.text
        assert props.json()["model_path"].endswith("alpha.json")
        assert [r.phase for r in h.router.state.replicas] == ["ready"]
        page = await h.client.get("/chat/alpha/")  # the simulator has no web page: the router's own serves
        assert page.status_code == 307 and page.headers["location"] == "../../talk?model=alpha"
        models_doc = await h.client.get("/chat/alpha/v1/models")
        assert models_doc.json()["data"][0]["owned_by"] == "llamacpp"
        streamed = await stream(h.client, "/chat/alpha/v1/chat/completions", chat_body("ignored"))
        assert streamed.status == 200 and streamed.done and len(streamed.tokens) >= 4
        unknown = await h.client.get("/chat/nope/")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        sneaky = await h.client.get("/chat/alpha/a/..%2f..%2fstatus")
        assert sneaky.status_code in (400, 404)
        rows = (await h.client.get("/history")).json()["rows"]

    chat_rows = [r for r in rows if r["endpoint"] == "/chat"]
    # The page reads that found the replica ready hold no slot and leave no row; the first read (which
    # loaded the model) and the completion do.
    assert [(r["status"], r["stream"]) for r in reversed(chat_rows)] == [(200, False), (200, True)]
    assert chat_rows[0]["generated_tokens"] == 4 and chat_rows[0]["model_served"] == "alpha"


async def a_status_says_unreachable(handle: RouterHandle) -> None:
    async def unreachable() -> bool:
        return bool((await handle.status())["rpc_devices"][0]["state"] == "unreachable")

    await until(unreachable, timeout=20, what="the RPC device unreachable")


async def test_dashboard_shows_each_peer_and_rpc_device_with_its_state(tmp_path: Path) -> None:
    """A router with one peer that answers (another router here) and one that does not, and an RPC device
    nothing listens at: /dash lists both peers, up and down, with the models of the one that answers, and
    the RPC device as unreachable with the model that lists it."""
    browser = find_browser()
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    async with running_router(tmp_path / "b", {"far": {}}) as b:
        peers = {
            "box": {"url": b.url, "refresh": 1.0},
            "gone": {"url": f"http://127.0.0.1:{free_port()}", "models": ["lost"], "connect_timeout": 1.0},
        }
        models = {"near": {}, "split": {"gpus": [], "rpc": ["lent"]}}
        rpc = {"lent": {"endpoint": f"127.0.0.1:{free_port()}", "memory_mib": 2048}}
        async with running_router(tmp_path / "a", models, peers=peers, rpc_devices=rpc) as a:
            with trio.fail_after(20):
                await a.router.wait_until(lambda s: "far" in s.settings.models and "gone" in s.peers_down)
            await a_status_says_unreachable(a)
            dom = (
                await chromium(browser, "--virtual-time-budget=4000", "--dump-dom", f"{a.url}/dash")
            ).decode()
    rows = {e["data-state"] for e in elements(dom, "tr", class_="peer-row")}
    assert rows == {"up", "down"}, rows
    assert "far" in dom and "lost" in dom
    cards = elements(dom, "article", class_="rpc-device")
    assert [(c["data-rpc"], c["data-state"]) for c in cards] == [("lent", "unreachable")]
    assert "used by split" in dom
