"""GET /props and GET /status/json through the real router and simulated upstreams: capacity, pool order,
requests in flight and waiting, and the same guards as /status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.shell.browser_safety_common import EVIL
from tests.support.client import assert_openai_error, chat_body, hold_busy
from tests.support.harness import running_router

MODELS: dict[str, dict[str, Any]] = {
    "big": {"parallel": 1, "gpus": [0], "sim": {"tokens": 4000, "token_rate": 200.0}},
    "small": {"parallel": 2, "gpus": [1], "aliases": ["tiny"]},
    "wide": {"parallel": 3, "num_instance": 2, "gpus": [2]},
}
POOLS = {
    "auto": {"members": ["big", "small"], "fallback": True, "aliases": ["chat"]},
    "first": {"members": ["wide", "small"]},
}
ROUTER = {"num_gpus": 3, "queue_limit": 7, "routing_queue_limit": 5, "max_models_per_gpu": 2}


def by_id(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in entries}


async def test_props_lists_capacity_pool_order_and_the_requests_in_flight_and_waiting(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as rt:
        await rt.wait_ready("big")
        await rt.wait_ready("small")
        reply = await rt.client.get("/props")
        assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
        doc = reply.json()
        assert [m["id"] for m in doc["models"]] == ["big", "small", "wide"]
        models = by_id(doc["models"])
        assert models["small"]["aliases"] == ["tiny"]
        assert models["wide"]["slots_per_replica"] == 3 and models["wide"]["replicas"] == 2
        assert models["wide"]["slots"] == 6 and models["wide"]["gpus"] == [2]
        assert models["wide"]["state"] == "unloaded" and models["wide"]["replicas_ready"] == 0
        assert models["big"]["state"] == "ready" and models["big"]["replicas_ready"] == 1
        assert models["big"]["ctx_per_slot"] == rt.router.launches["big"].ctx_per_slot
        pools = by_id(doc["pools"])
        auto, first = pools["auto"], pools["first"]
        assert [(m["priority"], m["model"]) for m in auto["members"]] == [(0, "big"), (1, "small")]
        assert auto["fallback"] is True and auto["aliases"] == ["chat"]
        assert auto["serving"] == ["big", "small"] and auto["slots"] == 1 + 2
        assert [m["model"] for m in first["members"]] == ["wide", "small"]
        assert first["fallback"] is False and first["serving"] == ["wide"] and first["slots"] == 6
        assert doc["in_flight"] == 0 and doc["waiting"] == 0
        assert (doc["queue_limit"], doc["routing_queue_limit"], doc["max_models_per_gpu"]) == (7, 5, 2)
        assert doc["shutting_down"] is False and doc["default_pool"] is None

        async with trio.open_nursery() as nursery:

            async def behind() -> None:
                await rt.client.post("/v1/chat/completions", json=chat_body("big", max_tokens=2))

            await hold_busy(nursery, rt.client, "/v1/chat/completions", chat_body("chat", max_tokens=4000))
            nursery.start_soon(behind)
            await rt.wait_state(lambda s: s.waiting == 1)
            doc = (await rt.client.get("/props")).json()
            big = by_id(doc["models"])["big"]
            assert (big["in_flight"], big["waiting"]) == (1, 1)
            auto = by_id(doc["pools"])["auto"]
            assert (auto["in_flight"], auto["waiting"]) == (1, 0)
            assert [m["in_flight"] for m in auto["members"]] == [1, 0]
            assert (doc["in_flight"], doc["waiting"]) == (1, 1)
            nursery.cancel_scope.cancel()


async def test_status_json_is_the_status_document(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router=ROUTER) as rt:
        # Both preloaded models must have settled, or a load may finish between the two reads.
        await rt.wait_ready("big")
        await rt.wait_ready("small")
        await rt.wait_idle()
        plain = await rt.status()
        reply = await rt.client.get("/status/json")
        assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
        doc = reply.json()
        assert doc.keys() == plain.keys()
        # GPU readings may move between the two calls; everything else is the same document.
        assert [g["id"] for g in doc.pop("gpus")] == [g["id"] for g in plain.pop("gpus")]
        assert doc == plain
        members = doc["pools"][0]["members"]
        assert [m["model"] for m in members] == ["big", "small"]
        assert [(m["slots_per_replica"], m["replicas"]) for m in members] == [(1, 1), (2, 1)]


async def test_props_and_status_json_sit_behind_the_keys_and_the_browser_guard(tmp_path: Path) -> None:
    async with running_router(tmp_path, MODELS, pools=POOLS, router={**ROUTER, "api_keys": ["sk-one"]}) as rt:
        key = {"Authorization": "Bearer sk-one"}
        for path in ("/props", "/status/json"):
            error = assert_openai_error(await rt.client.get(path), 401, "invalid_api_key")
            assert "Authorization: Bearer" in error["message"]
            assert (await rt.client.get(path, headers=key)).status_code == 200
            foreign = await rt.client.get(path, headers={**key, "Origin": EVIL})
            assert_openai_error(foreign, 403, "origin_not_allowed")
            embedded = {**key, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
            assert_openai_error(await rt.client.get(path, headers=embedded), 403, "cross_site_not_allowed")
            rebound = await rt.client.get(path, headers={**key, "Host": "attacker.example"})
            assert_openai_error(rebound, 403, "host_not_allowed")
