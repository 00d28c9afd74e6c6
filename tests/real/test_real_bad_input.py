"""The real llama-server's answers to bad bodies, as the client sees them through the router.

llama-server b11434 answers some bodies that are the client's mistake with 500 (its ``std::runtime_error``
checks) and malformed requests with an empty 400 (cpp-httplib); the router turns the first into 400s with
the replica's message and wraps the second in the OpenAI shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.client import assert_openai_error
from tests.support.realharness import long_body, real_router

pytestmark = pytest.mark.real

CHAT = "/v1/chat/completions"


async def test_bad_bodies_get_400s_with_llama_servers_own_words(tmp_path: Path) -> None:
    async with real_router(tmp_path, {"m": {}}) as rt:
        cases = [
            (CHAT, {**long_body("m", 2), "tools": "x"}, "Failed to parse tools"),
            (CHAT, {**long_body("m", 2), "messages": [{"content": "no role"}]}, "Failed to parse messages"),
            ("/v1/messages", {"model": "m", "max_tokens": 2}, "'messages' is required"),
        ]
        for path, body, words in cases:
            error = assert_openai_error(await rt.client.post(path, json=body), 400, "invalid_request")
            assert error["message"].startswith(words), error

        headers = {"content-type": "multipart/form-data; boundary=x"}
        multipart = await rt.client.post(CHAT, content=json.dumps(long_body("m", 2)), headers=headers)
        message = assert_openai_error(multipart, 400, "upstream_error")["message"]
        assert message == "the replica of 'm' answered 400 Bad Request with an empty body"

        typed = await rt.client.post(CHAT, json={**long_body("m", 2), "temperature": "hot"})
        assert "'temperature'" in assert_openai_error(typed, 400)["message"]  # llama-server's 400, as it is

        surrogate = await rt.client.post(CHAT, content=json.dumps(long_body("m\ud800", 2)).encode())
        assert_openai_error(surrogate, 400, "invalid_json")

        normal = await rt.client.post(CHAT, json=long_body("m", 2))
        assert normal.status_code == 200, normal.text
