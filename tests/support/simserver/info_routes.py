"""The endpoints that generate no text: health, the web page, /slots, /props, /models, /metrics, tokenising
and templates, and the slot-holding embeddings and rerank endpoints.
"""

from __future__ import annotations

import time
from typing import Any

from tests.support.simserver.generation import RequestError, anthropic_prompt, int_or_none
from tests.support.simserver.http_base import HandlerBase
from tests.support.simserver.shapes import BUILD_INFO
from tests.support.simserver.tokens import (
    CHAT_TEMPLATE,
    detokenize,
    embedding_for,
    render_chat,
    rerank_score,
    text_of,
    token_id,
    tokenize,
)


class InfoRoutes(HandlerBase):
    """The endpoints that generate nothing: health, slots, props, models, metrics, tokens, templates,
    embeddings and reranking (the last two hold a slot while they run)."""

    # -- simple endpoints ------------------------------------------------------------------------------

    def route_health(self) -> None:
        self.send_json(200, {"status": "ok"})

    def route_web_ui(self) -> None:
        if not self.state.behaviour.web_ui:
            raise RequestError(404, "File Not Found", "not_found_error")
        if "gzip" not in self.headers.get("Accept-Encoding", ""):
            self._send(415, b"Error: gzip is not supported by this browser", "text/plain")
            return
        self._send(200, b"<!doctype html><title>llama.cpp (simulated)</title>", "text/html")

    def route_slots(self) -> None:
        slots = []
        for slot_id, busy, task_id, cached in self.state.pool.snapshot():
            slot: dict[str, Any] = {
                "id": slot_id,
                "n_ctx": self.state.n_ctx_slot,
                "speculative": False,
                "is_processing": busy,
            }
            if task_id >= 0 or cached:  # like llama-server: a slot that never served has no task fields
                slot.update(id_task=task_id, n_prompt_tokens=cached)
            slots.append(slot)
        self.send_json(200, slots)

    def route_props(self) -> None:
        state = self.state
        self.send_json(
            200,
            {
                "default_generation_settings": {
                    "id": 0,
                    "id_task": -1,
                    "n_ctx": state.n_ctx_slot,
                    "speculative": False,
                    "is_processing": False,
                    "params": {"n_predict": -1, "temperature": 0.8, "stream": False},
                },
                "total_slots": len(state.pool.slots),
                "model_path": state.options.model,
                "model_alias": state.model_id,
                "modalities": {"vision": False, "audio": False},
                "chat_template": CHAT_TEMPLATE,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "build_info": BUILD_INFO,
            },
        )

    def route_models(self) -> None:
        state = self.state
        meta = {"n_ctx_train": state.behaviour.n_ctx_train, "n_ctx": state.n_ctx, "vocab_type": 1}
        self.send_json(
            200,
            {
                "models": [{"name": state.model_id, "model": state.model_id, "type": "model"}],
                "object": "list",
                "data": [
                    {
                        "id": state.model_id,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "llamacpp",
                        "meta": meta,
                    }
                ],
            },
        )

    def route_metrics(self) -> None:
        state = self.state
        if not state.options.metrics:
            raise RequestError(
                501,
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            )
        st = state.stats
        prompt_tps = st.prompt_tokens / st.prompt_seconds if st.prompt_seconds else 0.0
        predicted_tps = st.predicted_tokens / st.predicted_seconds if st.predicted_seconds else 0.0
        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", st.prompt_tokens),
            ("prompt_seconds_total", "counter", "Prompt process time", st.prompt_seconds),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                st.predicted_tokens,
            ),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", st.predicted_seconds),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", st.n_decode),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_tps),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                predicted_tps,
            ),
            ("requests_processing", "gauge", "Number of requests processing.", state.pool.busy_count()),
            ("requests_deferred", "gauge", "Number of requests deferred.", state.pool.deferred_count()),
        ]
        lines = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}"]
            lines.append(f"llamacpp:{name} {value}")
        self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")

    def route_tokenize(self) -> None:
        body = self._json_body()
        content = body.get("content", "")
        words = content.split() if isinstance(content, str) else []
        ids = [token_id(w) for w in words]
        if body.get("with_pieces"):
            self.send_json(200, {"tokens": [{"id": i, "piece": w} for i, w in zip(ids, words, strict=True)]})
        else:
            self.send_json(200, {"tokens": ids})

    def route_detokenize(self) -> None:
        body = self._json_body()
        tokens = body.get("tokens") or []
        self.send_json(200, {"content": detokenize(int(t) for t in tokens)})

    def route_apply_template(self) -> None:
        body = self._json_body()
        self.send_json(200, {"prompt": render_chat(body.get("messages") or [])})

    def route_count_tokens(self) -> None:
        body = self._json_body()
        self.send_json(200, {"input_tokens": len(tokenize(anthropic_prompt(body)))})

    # -- slot-holding endpoints without generation -------------------------------------------------------

    def _with_slot(self, prompt: list[int]) -> bool:
        slot = self.state.pool.acquire(prompt, -1, self._gone)
        if slot is None:
            self.close_connection = True
            return False
        self.state.pool.release(slot, prompt)
        self.state.stats.add_request(len(prompt), 0.0, 0, 0.0)
        return True

    def route_embeddings(self) -> None:
        body = self._json_body()
        inputs = body.get("input", body.get("content"))
        if inputs is None:
            raise RequestError(400, "'input' or 'content' is required")
        items = (
            inputs if isinstance(inputs, list) and not all(isinstance(t, int) for t in inputs) else [inputs]
        )
        texts = [item if isinstance(item, str) else detokenize(item) for item in items]
        ids = [tokenize(t) for t in texts]
        n_tokens = sum(len(i) for i in ids)
        if not self._with_slot([t for i in ids for t in i]):
            return
        dim = self.state.behaviour.embedding_dim
        vectors = [embedding_for(t, dim) for t in texts]
        if self.path.startswith("/embedding") and not self.path.startswith("/embeddings"):
            self.send_json(200, [{"index": n, "embedding": [v]} for n, v in enumerate(vectors)])
            return
        self.send_json(
            200,
            {
                "model": self.state.model_for(body),
                "object": "list",
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                "data": [{"embedding": v, "index": n, "object": "embedding"} for n, v in enumerate(vectors)],
            },
        )

    def route_rerank(self) -> None:
        body = self._json_body()
        query = body.get("query")
        documents = body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list):
            raise RequestError(400, "'query' (string) and 'documents' (list) are required")
        texts = [text_of(d) for d in documents]
        prompt = [t for d in texts for t in tokenize(query + " " + d)]
        if not self._with_slot(prompt):
            return
        results: list[dict[str, Any]] = [
            {"index": n, "relevance_score": rerank_score(query, d)} for n, d in enumerate(texts)
        ]
        if body.get("return_text") or body.get("return_documents"):
            for r in results:
                r["document"] = {"text": texts[r["index"]]}
        results.sort(key=lambda r: -r["relevance_score"])
        top_n = int_or_none(body.get("top_n"))
        if top_n is not None:
            results = results[:top_n]
        self.send_json(
            200,
            {
                "model": self.state.model_for(body),
                "object": "list",
                "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt)},
                "results": results,
            },
        )
