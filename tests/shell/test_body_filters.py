"""A model's ``set_params`` and ``strip_params`` through the real router: the replica (a simulated
llama-server that keeps every body it receives) gets the fields forced and removed on chat, completions and
embeddings, a pool's request gets those of the member that serves it, a model without filters gets the
client's bytes exactly, and /props shows each model's filters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.body_recorder import Received, received, recording_launcher
from tests.support.client import chat_body
from tests.support.harness import running_router

MODELS: dict[str, dict[str, Any]] = {
    "tuned": {
        "gpus": [0],
        "set_params": {"temperature": 0.2, "top_k": 40, "samplers": ["top_k", "temperature"]},
        "strip_params": ["seed"],
    },
    "member": {"gpus": [1], "set_params": {"temperature": 0.7}, "strip_params": ["top_k"]},
    "plain": {"gpus": [2]},
}
POOLS = {"team": {"members": ["member", "plain"]}}


def one_with(bodies: list[Received], path: str, marker: str) -> Received:
    """The one body received on ``path`` whose text holds ``marker``."""
    found = [b for b in bodies if b.path == path and marker.encode() in b.body]
    assert len(found) == 1, [(b.path, b.body[:200]) for b in bodies]
    return found[0]


async def test_fields_are_forced_and_removed_on_every_endpoint_and_kept_byte_for_byte_without_filters(
    tmp_path: Path,
) -> None:
    binary = recording_launcher(tmp_path)
    router = {"num_gpus": 3, "llama_server": str(binary)}
    async with running_router(tmp_path, MODELS, pools=POOLS, router=router) as h:
        chat = chat_body("tuned", "chat marker", temperature=0.9, seed=5, max_tokens=2, stream=True)
        reply = await h.client.post("/v1/chat/completions", json=chat)
        assert reply.status_code == 200 and "data: [DONE]" in reply.text
        completion = {"model": "tuned", "prompt": "completion marker", "seed": 1, "max_tokens": 2}
        assert (await h.client.post("/v1/completions", json=completion)).status_code == 200
        embedding = {"model": "tuned", "input": "embedding marker", "seed": 1, "top_k": 3}
        assert (await h.client.post("/v1/embeddings", json=embedding)).status_code == 200
        pooled = chat_body("team", "pool marker", top_k=7, temperature=1.5, max_tokens=1)
        reply = await h.client.post("/v1/chat/completions", json=pooled)
        assert reply.status_code == 200 and reply.json()["model"] == "member"
        # Spacing, key order and escapes that a parse and a dump would all change.
        raw = (
            b'{ "max_tokens" : 1,\n "model": "plain", "seed": 5, "top_k": 7,'
            b' "messages": [{"role": "user", "content": "plain marker caf\\u00e9 \xc3\xa9"}] }'
        )
        reply = await h.client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert reply.status_code == 200
        props = {m["id"]: m for m in (await h.client.get("/props")).json()["models"]}
    bodies = received(binary)

    got = one_with(bodies, "/v1/chat/completions", "chat marker").json()
    assert got["temperature"] == 0.2 and got["top_k"] == 40 and "seed" not in got
    assert got["samplers"] == ["top_k", "temperature"]
    assert got["model"] == "tuned" and got["stream"] is True and got["max_tokens"] == 2
    assert got["messages"] == [{"role": "user", "content": "chat marker"}]
    got = one_with(bodies, "/v1/completions", "completion marker").json()
    assert (got["temperature"], got["top_k"], got["prompt"]) == (0.2, 40, "completion marker")
    assert "seed" not in got
    got = one_with(bodies, "/v1/embeddings", "embedding marker").json()
    assert (got["temperature"], got["top_k"], got["input"]) == (0.2, 40, "embedding marker")
    assert "seed" not in got
    # The pool's member: its own filters, after its name replaced the pool's.
    got = one_with(bodies, "/v1/chat/completions", "pool marker").json()
    assert got["model"] == "member" and got["temperature"] == 0.7 and "top_k" not in got
    assert got["max_tokens"] == 1
    # No filters: the very bytes the client sent.
    assert one_with(bodies, "/v1/chat/completions", "plain marker").body == raw

    assert props["tuned"]["filters"] == {
        "set_params": {"temperature": 0.2, "top_k": 40, "samplers": ["top_k", "temperature"]},
        "strip_params": ["seed"],
    }
    assert props["member"]["filters"] == {"set_params": {"temperature": 0.7}, "strip_params": ["top_k"]}
    assert props["plain"]["filters"] == {"set_params": {}, "strip_params": []}
