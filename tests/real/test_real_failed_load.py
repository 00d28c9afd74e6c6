"""A load the real llama-server refuses names its cause, in the 503, in /status and in the router's log.

llama-server b11434 refuses a q8_0 K cache (blocks of 32) on a model whose heads are 16 wide (the "small"
tiny model: n_embd 64, 4 heads) when flash attention is not off, and says so once, first, before its
generic lines: ``llama_init_from_model: K cache type q8_0 with block size 32 does not divide
n_embd_head_k=16``, then "failed to create context", "failed to create_context", "exiting due to model
loading error". The cause line must lead what the router quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.client import assert_openai_error
from tests.support.realharness import long_body, real_router_process

pytestmark = pytest.mark.real

CAUSE = "K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"


async def test_a_refused_load_quotes_llama_servers_cause_everywhere(tmp_path: Path) -> None:
    async with real_router_process(tmp_path, {"m": {"ctk": "q8_0"}}) as rp:
        answer = await rp.client.post("/v1/chat/completions", json=long_body("m", 2))
        message = assert_openai_error(answer, 503, "load_failed")["message"]
        # the cause comes first among the quoted lines, then the generic ones, each once
        quoted = message.split("; log: ", 1)[1]
        assert quoted.startswith(f"llama_init_from_model: {CAUSE} | "), message
        assert quoted.endswith("exiting due to model loading error"), message
        assert quoted.count("failed to create context with model") == 1, message

        status = await rp.wait_status(lambda doc: any(h["kind"] == "load_failed" for h in doc["recent"]))
        failed = [h for h in status["recent"] if h["kind"] == "load_failed"]
        assert all(h["model"] == "m" for h in failed), failed
        assert CAUSE in failed[0]["reason"], failed

        logged = [line for line in rp.log_text().splitlines() if "load_failed m" in line]
        assert logged and CAUSE in logged[0], rp.log_text()[-3000:]
