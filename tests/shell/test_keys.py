"""Named API keys against the running router: each key's scope over models, pools and aliases, its rights on
the admin actions, and the class its requests reach the scheduler with (the key's, lowered by the request's
``x-router-class`` header or ``service_tier`` field, never raised)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from statemachine import RequestClass
from tests.support.client import assert_openai_error, chat_body
from tests.support.harness import RouterHandle, serving
from tests.support.simconfig import config_document

PLAIN, ALICE, BOB = "sk-plain-operator", "sk-alice-0123", "sk-bob-4567"
SLOW = {"tokens": 40, "token_rate": 20.0}  # two seconds a reply: long enough to see it in the scheduler
MODELS: dict[str, dict[str, Any]] = {
    "chat": {"aliases": ["c"], "parallel": 4, "sim": SLOW},
    "coder-7b": {},
    "other": {},
}
POOLS = {"auto": {"members": ["chat", "other"]}, "elsewhere": {"members": ["other"]}}
KEYS = {
    # "c" names chat by its alias; "auto" is a pool with chat, in scope, among its members.
    "alice": {
        "key": ALICE,
        "class": "interactive",
        "weight": 2,
        "models": ["c", "coder-*", "auto"],
        "admin": True,
    },
    "bob": {"key": BOB, "models": ["chat", "elsewhere"]},
}


def as_key(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def keyed_router(tmp_path: Path) -> AsyncIterator[RouterHandle]:
    router = {"api_keys": [PLAIN], "max_wait_batch": 900}
    doc = config_document(tmp_path, MODELS, pools=POOLS, router=router)
    async with serving(tmp_path, {**doc, "keys": KEYS}) as h:
        yield h


async def chat(h: RouterHandle, key: str, model: str, **extra: Any) -> httpx.Response:
    headers = {**as_key(key), **extra.pop("headers", {})}
    return await h.client.post(
        "/v1/chat/completions", json=chat_body(model, max_tokens=2, **extra), headers=headers
    )


async def test_a_key_reaches_only_its_models_and_lists_only_them(tmp_path: Path) -> None:
    async with keyed_router(tmp_path) as h:
        for key, model in [(BOB, "chat"), (BOB, "c"), (ALICE, "chat"), (ALICE, "coder-7b"), (ALICE, "auto")]:
            assert (await chat(h, key, model)).status_code == 200, (key, model)
        for key, model in [
            (BOB, "other"),
            (BOB, "coder-7b"),
            (BOB, "auto"),
            (ALICE, "other"),
            (ALICE, "elsewhere"),
        ]:
            error = assert_openai_error(await chat(h, key, model), 403, "permission_denied")
            assert error["type"] == "permission_error" and model in error["message"], error
        # A pool in scope none of whose members is: refused, saying what to add.
        error = assert_openai_error(await chat(h, BOB, "elsewhere"), 403, "permission_denied")
        assert "none of its members" in error["message"], error
        listed = {}
        for key in (ALICE, BOB, PLAIN):
            reply = await h.client.get("/v1/models", headers=as_key(key))
            listed[key] = {entry["id"] for entry in reply.json()["data"]}
        # The alias "c" has an entry of its own, listed for every key that may use chat by it.
        assert listed == {
            ALICE: {"chat", "c", "coder-7b", "auto"},
            BOB: {"chat", "c"},
            PLAIN: {"chat", "c", "coder-7b", "other", "auto", "elsewhere"},
        }
        assert (await h.client.get("/v1/models/c", headers=as_key(BOB))).status_code == 200
        assert_openai_error(
            await h.client.get("/v1/models/other", headers=as_key(BOB)), 403, "permission_denied"
        )
        upstream = await h.client.get("/upstream/other/props", headers=as_key(BOB))
        assert_openai_error(upstream, 403, "permission_denied")
        assert_openai_error(await chat(h, "sk-nobody", "chat"), 401, "invalid_api_key")
        await h.wait_idle()


async def test_only_admin_keys_and_plain_keys_may_unload_and_reload(tmp_path: Path) -> None:
    async with keyed_router(tmp_path) as h:
        for path in ("/unload", "/reload", "/models/load", "/models/unload"):
            error = assert_openai_error(await h.client.post(path, json={}, headers=as_key(BOB)), 403)
            assert error["code"] == "permission_denied" and "admin = true" in error["message"], error
        assert (await chat(h, ALICE, "coder-7b")).status_code == 200
        assert any(r.model == "coder-7b" for r in h.router.state.replicas)
        unloaded = await h.client.post("/unload", json={"model": "coder-7b"}, headers=as_key(ALICE))
        assert unloaded.status_code == 200 and unloaded.json()["unloaded"] == "coder-7b"
        assert not any(r.model == "coder-7b" for r in h.router.state.replicas)
        assert (await h.client.post("/unload", json={}, headers=as_key(PLAIN))).status_code == 200


async def test_a_request_lowers_its_class_never_raises_it(tmp_path: Path) -> None:
    async with keyed_router(tmp_path) as h:
        settings = h.router.deployment.settings
        assert dict(settings.weights) == {"alice": 2, "bob": 1}
        assert settings.policy.max_wait == (30.0, 120.0, 900.0)
        bad = await chat(h, ALICE, "chat", headers={"x-router-class": "urgent"})
        assert "urgent" in assert_openai_error(bad, 400, "invalid_class")["message"]
        bad = await chat(h, ALICE, "chat", service_tier="turbo")
        assert assert_openai_error(bad, 400, "invalid_class")["type"] == "invalid_request_error"
        # (key, what the request asks for) -> the key's name and the class the scheduler is told
        cases: list[tuple[str, dict[str, Any], str, RequestClass]] = [
            (ALICE, {}, "alice", RequestClass.INTERACTIVE),
            (ALICE, {"service_tier": "flex"}, "alice", RequestClass.BATCH),
            (
                ALICE,
                {"service_tier": "default", "headers": {"x-router-class": "standard"}},
                "alice",
                RequestClass.STANDARD,
            ),
            (BOB, {"service_tier": "priority"}, "bob", RequestClass.STANDARD),  # clamped to its key's class
            (BOB, {"headers": {"x-router-class": "interactive"}}, "bob", RequestClass.STANDARD),
            (PLAIN, {"headers": {"x-router-class": "batch"}}, "", RequestClass.BATCH),
        ]
        for key, asks, name, klass in cases:
            assert await admitted_as(h, key, asks) == (name, klass, 200), asks


async def admitted_as(h: RouterHandle, key: str, asks: dict[str, Any]) -> tuple[str, RequestClass, int]:
    """Send one chat request with ``key`` asking for ``asks``: the key name and the class the scheduler
    holds it under while it runs, and its answer's status."""
    answers: list[int] = []

    async def send() -> None:
        answers.append((await chat(h, key, "chat", **dict(asks))).status_code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        state = await h.wait_state(lambda s: any(r.target == "chat" for r in s.requests.values()))
        (request,) = [r for r in state.requests.values() if r.target == "chat"]
    return request.key, request.klass, answers[0]


async def test_without_keys_a_request_can_still_ask_for_batch(tmp_path: Path) -> None:
    doc = config_document(tmp_path, {"chat": {"sim": SLOW}})
    async with serving(tmp_path, doc) as h:
        answers: list[int] = []

        async def send() -> None:
            body = chat_body("chat", max_tokens=2, service_tier="flex")
            answers.append((await h.client.post("/v1/chat/completions", json=body)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            state = await h.wait_state(lambda s: bool(s.requests))
            (request,) = state.requests.values()
            assert (request.key, request.klass) == ("", RequestClass.BATCH)
        assert answers == [200]
        bad = await h.client.post(
            "/v1/chat/completions", json=chat_body("chat"), headers={"x-router-class": "x"}
        )
        assert_openai_error(bad, 400, "invalid_class")
        assert (await h.client.post("/unload", json={})).status_code == 200  # no keys: every right


async def test_a_reload_with_a_bad_key_table_is_refused_without_showing_the_secret(tmp_path: Path) -> None:
    async with keyed_router(tmp_path) as h:
        path = tmp_path / "router.json"
        doc = json.loads(path.read_text())
        doc["keys"]["carol"] = {"key": ALICE, "models": ["chat"]}  # alice's secret
        path.write_text(json.dumps(doc))
        reply = await h.client.post("/reload", json={}, headers=as_key(ALICE))
        error = assert_openai_error(reply, 400, "invalid_config")
        assert "keys.carol.key is invalid: it holds the same secret as keys.alice" in error["message"]
        assert ALICE not in reply.text
        assert "carol" not in h.router.config.keys  # the old configuration keeps serving
        assert (await chat(h, ALICE, "coder-7b")).status_code == 200


async def test_a_pool_member_outside_the_keys_scope_never_serves_it(tmp_path: Path) -> None:
    async with keyed_router(tmp_path) as h:
        # alice may use the pool auto (chat, other) but not other: with chat's four slots busy, her fifth
        # request waits for chat instead of loading other.
        answers: list[int] = []

        async def send() -> None:
            answers.append((await chat(h, ALICE, "auto")).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(send)
            state = await h.wait_state(lambda s: len(s.requests) == 5 and s.waiting == 1)
            (waiting,) = [r for r in state.requests.values() if r.phase == "queued"]
            assert waiting.outside == frozenset({"other"})
        assert answers == [200] * 5
        assert not any(r.model == "other" for r in h.router.state.replicas)
        served = [
            r["model_served"] for r in (await h.client.get("/history", headers=as_key(ALICE))).json()["rows"]
        ]
        assert served == ["chat"] * 5
