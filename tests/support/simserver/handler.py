"""The request handler: dispatch by method and path, and the endpoints that generate text (OpenAI chat
completions, completions and Responses, llama.cpp's /completion and /infill, Anthropic Messages), with
the generation loop that paces tokens, honours stop strings and notices a client that went away.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from tests.support.simserver.behaviour import Behaviour
from tests.support.simserver.generation import (
    Generation,
    Job,
    RequestError,
    anthropic_prompt,
    int_or_none,
    prompt_ids,
    stop_list,
)
from tests.support.simserver.http_base import peer_gone
from tests.support.simserver.info_routes import InfoRoutes
from tests.support.simserver.log import log
from tests.support.simserver.shapes import (
    ChatShape,
    CompletionShape,
    MessagesShape,
    NativeShape,
    ResponsesShape,
    Shape,
)
from tests.support.simserver.slot_files import SlotFileRoutes
from tests.support.simserver.tokens import render_chat, text_of, token_id, tokenize

HEALTH_HELD = "srv  log_server_r: /health held unanswered (simulated hang)"


class Handler(InfoRoutes, SlotFileRoutes):
    """The request handler: dispatch by path, and the endpoints that generate text."""

    # -- dispatch --------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(GET_ROUTES)

    def do_POST(self) -> None:
        self._dispatch(POST_ROUTES)

    def _dispatch(self, routes: dict[str, Callable[[Handler], None]]) -> None:
        path = self.path.split("?", 1)[0]
        self._streaming = False
        if path in ("/health", "/v1/health") and self.state.behaviour.hang_health:
            self.close_connection = True
            log(HEALTH_HELD)  # a test sees the request held here without waiting to see no answer
            while True:
                time.sleep(3600)
        try:
            if not self.state.ready.is_set():
                self._read_body()
                raise RequestError(503, "Loading model", "unavailable_error")
            if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
                self._read_body()  # cpp-httplib refuses a multipart body it cannot parse: empty 400
                self.close_connection = True
                self._send(400, b"", "text/plain")
                return
            route = routes.get(path)
            if route is None and routes is POST_ROUTES and path.startswith("/slots/"):
                route = Handler.route_slot_action
            if route is None:
                self._read_body()
                raise RequestError(404, "File Not Found", "not_found_error")
            route(self)
        except RequestError as err:
            self.send_error_obj(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            log(f"srv  log_server_r: internal error on {self.command} {path}: {exc!r}")
            self.close_connection = True
            if not self._streaming:
                self.send_error_obj(RequestError(500, f"internal error: {exc!r}", "server_error"))

    # -- generation endpoints ----------------------------------------------------------------------------

    def _job(self, body: dict[str, Any], prompt: list[int], requested: Any, stop: Any) -> Job:
        behaviour = self.state.behaviour
        limit = int_or_none(requested)
        if limit is None or limit < 0:
            n_out, limited = behaviour.tokens, False
        else:
            n_out, limited = min(limit, behaviour.tokens), limit < behaviour.tokens
        id_slot = int_or_none(body.get("id_slot"))
        return Job(
            prompt=prompt,
            n_out=max(n_out, 0),
            limited=limited,
            stop=stop_list(stop),
            stream=bool(body.get("stream")),
            model=self.state.model_for(body),
            id_slot=-1 if id_slot is None else id_slot,
        )

    def route_chat_completions(self) -> None:
        body = self._json_body()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' is required and must be a non-empty list")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            shown = json.dumps(tools, ensure_ascii=False)  # nlohmann's dump() does not escape either
            raise RequestError(
                500, f"Failed to parse tools: Expected 'tools' to be an array, got {shown}", "server_error"
            )
        for message in messages:
            if isinstance(message, dict) and "role" not in message:
                shown = json.dumps(message, ensure_ascii=False)
                raise RequestError(
                    500, f"Failed to parse messages: Missing 'role' in message: {shown}", "server_error"
                )
        requested = body.get("max_completion_tokens", body.get("max_tokens", body.get("n_predict")))
        job = self._job(body, tokenize(render_chat(messages)), requested, body.get("stop"))
        self._generate(job, ChatShape(), "chatcmpl-")

    def route_completions(self) -> None:
        body = self._json_body()
        requested = body.get("max_tokens", body.get("n_predict"))
        job = self._job(body, prompt_ids(body.get("prompt")), requested, body.get("stop"))
        self._generate(job, CompletionShape(), "cmpl-")

    def route_completion_native(self) -> None:
        body = self._json_body()
        requested = body.get("n_predict", body.get("max_tokens"))
        job = self._job(body, prompt_ids(body.get("prompt")), requested, body.get("stop"))
        self._generate(job, NativeShape(), "")

    def route_infill(self) -> None:
        body = self._json_body()
        extra = " ".join(text_of(chunk) for chunk in body.get("input_extra") or [])
        text = " ".join(
            part
            for part in (
                extra,
                "<|fim_prefix|>",
                str(body.get("input_prefix", "")),
                "<|fim_suffix|>",
                str(body.get("input_suffix", "")),
                "<|fim_middle|>",
                str(body.get("prompt", "")),
            )
            if part
        )
        requested = body.get("n_predict", body.get("max_tokens"))
        job = self._job(body, tokenize(text), requested, body.get("stop"))
        self._generate(job, NativeShape(), "")

    def route_messages(self) -> None:
        body = self._json_body()
        prompt = tokenize(anthropic_prompt(body))
        job = self._job(body, prompt, body.get("max_tokens"), body.get("stop_sequences"))
        self._generate(job, MessagesShape(), "msg_")

    def route_responses(self) -> None:
        body = self._json_body()
        given = body.get("input")
        if isinstance(given, str):
            messages: list[dict[str, Any]] = [{"role": "user", "content": given}]
        elif isinstance(given, list) and given:
            messages = [
                item if isinstance(item, dict) and "role" in item else {"role": "user", "content": item}
                for item in given
            ]
        else:
            raise RequestError(400, "'input' is required")
        if body.get("instructions"):
            messages = [{"role": "system", "content": text_of(body["instructions"])}, *messages]
        job = self._job(body, tokenize(render_chat(messages)), body.get("max_output_tokens"), None)
        self._generate(job, ResponsesShape(), "resp_")

    def _generate(self, job: Job, shape: Shape, id_prefix: str) -> None:
        state = self.state
        behaviour = state.behaviour
        n_prompt = len(job.prompt)
        if n_prompt + job.n_out > state.n_ctx_slot or (n_prompt >= state.n_ctx_slot > 0):
            raise RequestError(
                400,
                "the request exceeds the available context size, try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=n_prompt,
                n_ctx=state.n_ctx_slot,
            )
        slot = state.pool.acquire(job.prompt, job.id_slot, self._gone)
        if slot is None:
            self.close_connection = True
            log("srv  operator(): client gone while the request was waiting for a slot")
            return
        gen = Generation(
            job=job,
            ident=id_prefix + os.urandom(12).hex(),
            created=int(time.time()),
            slot_id=slot.id,
            n_cache=slot.n_cache,
        )
        log(f"slot launch_slot_: id {slot.id:2d} | task {slot.task_id} | processing task")
        cancelled = False
        try:
            cancelled = not self._run(gen, shape, behaviour)
        finally:
            state.pool.release(slot, job.prompt + gen.ids)
            state.stats.add_request(
                n_prompt - gen.n_cache, gen.prompt_ms / 1e3, gen.n_out, gen.predicted_ms / 1e3
            )
            how = "cancelled" if cancelled else "stop processing"
            log(f"slot      release: id {slot.id:2d} | {how}: n_past = {n_prompt + gen.n_out}")

    def _run(self, gen: Generation, shape: Shape, behaviour: Behaviour) -> bool:
        """Process the prompt, then produce the tokens; False when the client went away."""
        job = gen.job
        sock = self.connection
        started = time.monotonic()
        n_eval = gen.n_prompt - gen.n_cache
        if behaviour.prompt_rate and n_eval and peer_gone(sock, n_eval / behaviour.prompt_rate):
            self.close_connection = True
            return False
        t0 = time.monotonic()
        gen.prompt_ms = max((t0 - started) * 1e3, 0.001 * n_eval)
        if job.stream:
            self._streaming = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self._send_cors()
            self.end_headers()
            head = b"".join(shape.head(gen))
            if head and not self._write_chunk(head):
                self.close_connection = True
                return False
        reply_words = behaviour.reply.split() if behaviour.reply else []
        rate = behaviour.token_rate
        finish = "length" if job.limited else "stop"
        for i in range(job.n_out):
            if rate and rate > 0:
                if peer_gone(sock, max(t0 + (i + 1) / rate - time.monotonic(), 0.0)):
                    self.close_connection = True
                    return False
            elif peer_gone(sock):
                self.close_connection = True
                return False
            word = reply_words[i % len(reply_words)] if reply_words else f"tok{i}"
            piece = " " + word
            hit = self._stop_hit(gen.text, piece, job.stop)
            if hit is not None:
                piece, gen.stop_word = hit
                finish = "word"
            gen.predicted_ms = (time.monotonic() - t0) * 1e3
            if piece:
                gen.pieces.append(piece)
                gen.ids.append(token_id(word))
                if job.stream and not self._write_chunk(b"".join(shape.token(gen, piece))):
                    self.close_connection = True
                    return False
                total = self.state.stats.count_token()
                crash_after = behaviour.crash_after_tokens
                if crash_after is not None and total >= crash_after:
                    log(f"CUDA error: an illegal memory access was encountered (after {total} tokens)")
                    log("/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error")
                    os._exit(1)
            if finish == "word":
                break
        gen.finish = finish
        gen.predicted_ms = max((time.monotonic() - t0) * 1e3, 0.001 * gen.n_out)
        if job.stream:
            ok = self._write_chunk(b"".join(shape.tail(gen))) and self._write_chunk(b"")
            if not ok:
                self.close_connection = True
                return False
        else:
            self.send_json(200, shape.body(gen))
        return True

    @staticmethod
    def _stop_hit(text: str, piece: str, stops: tuple[str, ...]) -> tuple[str, str] | None:
        """When ``piece`` completes a stop string: the part of it to emit and the stop string."""
        joined = text + piece
        best: tuple[int, str] | None = None
        for stop in stops:
            at = joined.find(stop, max(len(text) - len(stop) + 1, 0))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return None
        return joined[len(text) : best[0]] if best[0] > len(text) else "", best[1]


GET_ROUTES: dict[str, Callable[[Handler], None]] = {
    "/": Handler.route_web_ui,
    "/health": Handler.route_health,
    "/v1/health": Handler.route_health,
    "/slots": Handler.route_slots,
    "/props": Handler.route_props,
    "/models": Handler.route_models,
    "/v1/models": Handler.route_models,
    "/metrics": Handler.route_metrics,
}

POST_ROUTES: dict[str, Callable[[Handler], None]] = {
    "/completion": Handler.route_completion_native,
    "/completions": Handler.route_completions,
    "/v1/completions": Handler.route_completions,
    "/chat/completions": Handler.route_chat_completions,
    "/v1/chat/completions": Handler.route_chat_completions,
    "/infill": Handler.route_infill,
    "/tokenize": Handler.route_tokenize,
    "/detokenize": Handler.route_detokenize,
    "/apply-template": Handler.route_apply_template,
    "/embedding": Handler.route_embeddings,
    "/embeddings": Handler.route_embeddings,
    "/v1/embeddings": Handler.route_embeddings,
    "/rerank": Handler.route_rerank,
    "/reranking": Handler.route_rerank,
    "/v1/rerank": Handler.route_rerank,
    "/v1/reranking": Handler.route_rerank,
    "/v1/messages": Handler.route_messages,
    "/v1/messages/count_tokens": Handler.route_count_tokens,
    "/v1/responses": Handler.route_responses,
    "/responses": Handler.route_responses,
}
