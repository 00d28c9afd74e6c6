"""A pool of two real tiny models: with the primary saturated, the next request goes to the second."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.client import hold_busy
from tests.support.realharness import long_body, real_router

pytestmark = pytest.mark.real


async def test_the_second_member_answers_when_the_primary_is_full(tmp_path: Path) -> None:
    models = {
        "primary": {"parallel": 1, "gpus": [0]},
        "second": {"parallel": 1, "gpus": [1], "shape": "other"},
    }
    pools = {"auto": {"members": ["primary", "second"], "fallback": True}}
    async with real_router(tmp_path, models, pools=pools, router={"num_gpus": 2}) as rt:
        await rt.wait_ready("primary", timeout=60)
        await rt.wait_ready("second", timeout=60)
        first = await rt.client.post("/v1/chat/completions", json=long_body("auto", 4))
        assert first.headers["x-router-model"] == "primary" and first.json()["model"] == "primary"
        async with trio.open_nursery() as nursery:
            await hold_busy(nursery, rt.client, "/v1/chat/completions", long_body("primary", 1900))
            reply = await rt.client.post("/v1/chat/completions", json=long_body("auto", 4))
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-router-model"] == "second"
            assert reply.json()["model"] == "second"
            nursery.cancel_scope.cancel()
