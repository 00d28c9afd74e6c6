"""A load's progress as the router shows it: on /status, /props and /metrics while a replica loads, in the
SSE comments of a stream that waits for it (and Anthropic's ping events), read from what the simulated
llama-server has mapped of a model file of several MiB that it touches page by page over its load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anthropic
import trio

from tests.support.client import chat_body, start_stream, stream
from tests.support.harness import RouterHandle, running_router
from tests.support.simconfig import SIM_DEFAULTS
from tests.support.simtools import write_padded_model
from tests.support.waiting import until

LOADING = re.compile(r"^loading a (\d+)% (\d+) s \(waiting for 'a' \d+ s, queue position 1\)$")


def slow_model(dir: Path) -> dict[str, Any]:
    model = write_padded_model(dir / "models", "a", 64, **{**SIM_DEFAULTS, "load_delay": 3.0, "tokens": 3})
    return {"a": {"model": str(model)}}


async def progress_seen(h: RouterHandle) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """/status's replica, /props's model entry and the /metrics line while the load is part way."""
    status = (await h.client.get("/status")).json()
    loading = [r for r in status["replicas"] if r["load"] is not None]
    if not loading or not 0 < loading[0]["load"]["percent"] < 90:
        return None
    props = (await h.client.get("/props")).json()
    metrics = (await h.client.get("/metrics")).text
    lines = [line for line in metrics.splitlines() if line.startswith("llama_router_replica_load_progress{")]
    (model,) = [m for m in props["models"] if m["id"] == "a"]
    return (loading[0], model, lines[0]) if model["loading"] and lines else None


async def test_a_load_shows_its_progress_on_status_props_metrics_and_a_waiting_stream(tmp_path: Path) -> None:
    async with running_router(tmp_path, slow_model(tmp_path)) as h, trio.open_nursery() as nursery:
        waiting = start_stream(nursery, h.client, chat_body("a", max_tokens=3))
        replica, model, metric = await until(lambda: progress_seen(h), what="a load part way")
        await waiting.done.wait()
        status = await h.status()
    assert replica["state"] == "loading" and replica["load"]["source"] == "mapped"
    (load,) = model["loading"]
    assert load["replica"] == replica["id"] and 0 < load["percent"] < 90
    fraction = float(metric.rsplit(" ", 1)[1])
    assert metric.startswith(f'llama_router_replica_load_progress{{model="a",replica="{replica["id"]}"}}')
    assert 0 < fraction < 0.9
    assert [r["load"] for r in status["replicas"]] == [None]  # ready now: nothing to show
    reply = waiting.stream
    assert reply.status == 200 and reply.done and reply.text() == " tok0 tok1 tok2"
    early = [c.comment for c in reply.comments if c.at < reply.first_token_at]
    found = [LOADING.match(c or "") for c in early]
    assert early and all(found), early
    percents = [int(m.group(1)) for m in found if m]
    assert percents == sorted(percents) and percents[-1] > percents[0], percents  # it moves, never back
    assert min(percents) < 90


async def test_an_anthropic_stream_waiting_for_a_load_gets_pings_and_the_sdk_reads_it(tmp_path: Path) -> None:
    body = {"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with running_router(tmp_path, slow_model(tmp_path)) as h:
        raw = await stream(h.client, "/v1/messages", body)
        await h.client.post("/models/unload", json={"model": "a"})
        await h.wait_state(lambda s: not s.replicas)
        client = anthropic.AsyncAnthropic(base_url=h.url, api_key="unused", max_retries=0, timeout=30.0)
        async with client, client.messages.stream(**body) as sdk:  # type: ignore[arg-type]
            text = "".join([piece async for piece in sdk.text_stream])
    names = [e.event for e in raw.events if e.data is not None]
    first = names.index("message_start")
    assert first > 0 and set(names[:first]) == {"ping"}, names
    assert all(e.comment and e.comment.startswith("loading a ") for e in raw.comments)
    assert text.strip() == "tok0 tok1"
