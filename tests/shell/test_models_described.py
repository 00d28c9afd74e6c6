"""/v1/models describes each model: its usable context (``context_length``, ``max_context_length``), its load
status in the shape of llama-server's router mode (``status.value``, ``status.failed``), what it can do
(``capabilities``), and an entry for each alias (``alias_of``, no ``slots``) that a key sees exactly when
it may use that name and that a peer router does not count as capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import trio

from statemachine.queries import replicas_of
from tests.support.client import assert_openai_error, chat_body, start_post
from tests.support.harness import RouterHandle, running_router, serving
from tests.support.simconfig import config_document

SLOW = {"load_delay": 1.0}


async def listed(h: RouterHandle, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    reply = await h.client.get("/v1/models", headers=headers or {})
    assert reply.status_code == 200, reply.text
    return {entry["id"]: entry for entry in reply.json()["data"]}


async def test_entries_give_context_status_and_capabilities(tmp_path: Path) -> None:
    models = {
        "chat": {"ctx": 8192, "parallel": 2, "aliases": ["c"], "sim": SLOW},
        "embed": {"ctx": 2048, "embedding": True},
        "ranker": {"ctx": 4096, "reranking": True},
        "eyes": {"ctx": 4096, "mmproj": str(tmp_path / "proj.gguf"), "no-jinja": True},
    }
    pools = {"any": {"members": ["chat", "embed", "eyes"], "aliases": ["whichever"]}}
    async with running_router(tmp_path, models, pools=pools) as h, trio.open_nursery() as nursery:
        before = await listed(h)
        chat = before["chat"]
        assert chat["context_length"] == chat["max_context_length"] == chat["ctx_per_slot"] == 4096
        assert chat["ctx"] == 8192 and chat["slots"] == 2
        assert chat["status"] == {"value": "unloaded"} and chat["state"] == "unloaded"
        assert chat["capabilities"] == ["chat", "completion", "tools"]
        assert before["embed"]["capabilities"] == ["embedding"]
        assert before["embed"]["context_length"] == 2048
        assert before["ranker"]["capabilities"] == ["rerank"]
        assert before["eyes"]["capabilities"] == ["chat", "completion", "vision"]
        pool = before["any"]
        assert pool["context_length"] == pool["max_context_length"] == 2048  # its smallest member's
        assert pool["capabilities"] == ["chat", "completion", "embedding", "vision", "tools"]
        assert pool["status"] == {"value": "unloaded"}

        pending = start_post(nursery, h.client, chat_body("c", max_tokens=2))
        await h.wait_state(lambda s: any(r.phase == "loading" for r in replicas_of(s, "chat")))
        during = await listed(h)
        assert during["chat"]["status"] == during["c"]["status"] == {"value": "loading"}
        assert during["any"]["status"] == {"value": "loading"}
        await pending.done.wait()
        after = await listed(h)
    assert pending.response is not None and pending.response.status_code == 200
    assert after["chat"]["status"] == {"value": "loaded"} and after["chat"]["state"] == "ready"
    assert after["any"]["status"] == {"value": "loaded"}
    assert after["embed"]["status"] == {"value": "unloaded"}


async def test_a_failed_load_shows_as_failed_until_the_next_load(tmp_path: Path) -> None:
    models = {"broken": {"sim": {"oom_at_load": True}}, "fine": {}}
    async with running_router(tmp_path, models) as h:
        reply = await h.client.post("/v1/chat/completions", json=chat_body("broken", max_tokens=2))
        assert reply.status_code >= 500, reply.text
        await h.wait_state(lambda s: not replicas_of(s, "broken"))
        entries = await listed(h)
    assert entries["broken"]["status"] == {"value": "unloaded", "failed": True}
    assert entries["broken"]["state"] == "unloaded"
    assert entries["fine"]["status"] == {"value": "unloaded"}  # never loaded: nothing failed


async def test_each_alias_has_an_entry_of_its_own_without_capacity(tmp_path: Path) -> None:
    models = {"chat": {"ctx": 4096, "parallel": 2, "aliases": ["c", "talk"], "pricing": {"input": 0.5}}}
    pools = {"auto": {"members": ["chat"], "aliases": ["best"]}}
    async with running_router(tmp_path, models, pools=pools) as h:
        document = (await h.client.get("/v1/models")).json()
        by_id = {entry["id"]: entry for entry in document["data"]}
        one = (await h.client.get("/v1/models/talk")).json()
        pool_alias = (await h.client.get("/v1/models/best")).json()
    assert [entry["id"] for entry in document["data"]] == ["chat", "c", "talk", "auto", "best"]
    chat, alias = by_id["chat"], by_id["c"]
    assert alias["alias_of"] == "chat" and "alias_of" not in chat
    assert "slots" not in alias and "aliases" not in alias and chat["slots"] == 2
    for field in ("context_length", "max_context_length", "capabilities", "status", "state", "pricing"):
        assert alias[field] == chat[field], field
    assert alias["object"] == "model"
    assert one == {**by_id["talk"], "created": one["created"]}
    assert pool_alias["alias_of"] == "auto" and pool_alias["pool"] == ["chat"]


async def test_an_alias_entry_is_listed_only_for_keys_that_may_use_it(tmp_path: Path) -> None:
    models = {"chat": {"aliases": ["c"]}, "secret": {"aliases": ["hidden"]}}
    doc = config_document(tmp_path, models, router={"api_keys": ["sk-admin-0000"]})
    doc["keys"] = {
        "bob": {"key": "sk-bob-0000", "models": ["chat"]},
        "carol": {"key": "sk-carol-0000", "models": ["hidden"]},  # secret, by its alias only
    }
    async with serving(tmp_path, doc) as h:
        bob = {"Authorization": "Bearer sk-bob-0000"}
        carol = {"Authorization": "Bearer sk-carol-0000"}
        seen_by_bob = await listed(h, bob)
        seen_by_carol = await listed(h, carol)
        refused = await h.client.get("/v1/models/hidden", headers=bob)
        allowed = await h.client.get("/v1/models/hidden", headers=carol)
    assert set(seen_by_bob) == {"chat", "c"}
    assert set(seen_by_carol) == {"secret", "hidden"}
    assert_openai_error(refused, 403, "permission_denied")
    assert allowed.status_code == 200 and allowed.json()["alias_of"] == "secret"


async def test_a_peer_counts_a_models_capacity_once_and_learns_its_aliases(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    far = {"far": {"ctx": 8192, "parallel": 2, "aliases": ["f1", "f2", "f3"], "embedding": True}}
    async with running_router(tmp_path / "b", far) as b:
        assert len((await b.models())["data"]) == 4  # far and its three aliases
        peers = {"box": {"url": b.url}}  # models discovered from b's /v1/models
        async with running_router(tmp_path / "a", {"near": {}}, peers=peers) as a:
            await a.wait_state(lambda s: "far" in s.settings.models)
            [peer] = (await a.status())["peers"]
            entries = await listed(a)
            served = await a.client.post("/v1/embeddings", json={"model": "f2", "input": "hello"})
    assert peer["advertised_capacity"] == 2  # far's two slots, not eight
    assert peer["models"] == ["far"]
    assert a.router.state.settings.peer_limit("box") == 2
    assert set(entries) == {"near", "far", "f1", "f2", "f3"}
    assert entries["far"]["aliases"] == ["f1", "f2", "f3"] and entries["far"]["peer"] == "box"
    assert entries["f1"]["alias_of"] == "far" and entries["f1"]["peer"] == "box"
    assert entries["far"]["context_length"] == 4096 and entries["far"]["capabilities"] == ["embedding"]
    assert served.status_code == 200, served.text
    assert served.headers["x-router-model"] == "far"


async def test_the_openai_client_lists_alias_entries(tmp_path: Path) -> None:
    models = {"chat": {"aliases": ["gpt-local"], "ctx": 4096}}
    async with running_router(tmp_path, models) as h:
        client = openai.AsyncOpenAI(base_url=h.url + "/v1", api_key="unused", max_retries=0, timeout=30.0)
        async with client:
            page = await client.models.list()
            ids = [m.id for m in page.data]
            extras = {m.id: m.model_extra or {} for m in page.data}
    assert ids == ["chat", "gpt-local"]
    assert extras["gpt-local"]["alias_of"] == "chat" and "slots" not in extras["gpt-local"]
    assert extras["chat"]["context_length"] == 4096 and extras["chat"]["slots"] == 1
