"""The simulated llama-server behaves like the real one where the router can tell, and its faults fire."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.shell.ports import free_port
from tests.support.simserver.handler import HEALTH_HELD
from tests.support.simserver.main import SIGTERM_IGNORED
from tests.support.simtools import (
    REPO,
    SimRun,
    read_records,
    running_sim,
    sim_launcher,
    wait_listening,
    write_sim_model,
    write_sim_sidecar,
)
from tests.support.waiting import until_blocking

FAST = {"load_delay": 0.05, "token_rate": None}


def wait_healthy(url: str, timeout: float = 5.0) -> None:
    until_blocking(lambda: httpx.get(url + "/health").status_code == 200, timeout=timeout, what="healthy")


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    """(event name, data) for each server-sent event."""
    event: str | None = None
    for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield event, line.removeprefix("data: ")
            event = None


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    until_blocking(predicate, timeout=timeout)


def raw_post(port: int, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST on a connection of its own and return the socket, without reading the reply."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    head = f"POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
    sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    return sock


def read_response(sock: socket.socket) -> tuple[int, Any]:
    """Read one non-streamed HTTP response: (status, parsed JSON body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the reply"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(
        int(v) for k, _, v in (h.partition(": ") for h in lines[1:]) if k.lower() == "content-length"
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed early"
        rest += chunk
    return int(lines[0].split()[1]), json.loads(rest[:length])


def slot_busy(url: str) -> bool:
    return any(s["is_processing"] for s in httpx.get(url + "/slots").json())


def deferred(url: str) -> int:
    """How many requests wait for a slot (the simulator started with ``--metrics``)."""
    text = httpx.get(url + "/metrics").text
    [value] = [
        line.split()[1] for line in text.splitlines() if line.startswith("llamacpp:requests_deferred ")
    ]
    return int(float(value))


@pytest.fixture(scope="module")
def fast_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimRun]:
    """One quick server (no pacing, 2 slots of 512 tokens) shared by the shape tests."""
    model = write_sim_model(tmp_path_factory.mktemp("fast"), "fast", tokens=8, **FAST)
    with running_sim(model, ctx=1024, slots=2, extra=("--fit", "off", "--metrics", "--jinja")) as sim:
        wait_healthy(sim.url)
        yield sim


# ---------------------------------------------------------------------------------------------------------
# Loading, health and process faults


def test_health_is_503_while_loading_then_200(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "slow", load_delay=0.6)
    port = free_port()
    with (tmp_path / "log").open("wb") as log_file:
        command = [sys.executable, "-m", "tests.support.simserver", "--port", str(port), "-m", str(model)]
        proc = subprocess.Popen([*command, "--fit", "off", "--foo"], stderr=log_file, cwd=REPO)
    try:
        wait_listening(port, proc=proc)
        url = f"http://127.0.0.1:{port}"
        first = httpx.get(url + "/health")
        assert first.status_code == 503
        assert first.json() == {
            "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
        }
        assert httpx.post(url + "/v1/chat/completions", json=chat("hi")).status_code == 503
        wait_healthy(url)
        assert httpx.get(url + "/health").json() == {"status": "ok"}
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0
    log = (tmp_path / "log").read_text()
    assert f"main: server is listening on http://127.0.0.1:{port}" in log
    assert "model buffer size" in log


def test_oom_at_load_prints_cuda_error_and_exits_1(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "big", load_delay=0.05, oom_at_load=True, oom_mib=4096)
    with running_sim(model, env={"CUDA_VISIBLE_DEVICES": "0"}, wait=False) as sim:
        assert sim.proc.wait(timeout=5) == 1
        log = sim.log_text()
    assert (
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: "
        "cudaMalloc failed: out of memory"
    ) in log
    assert "llama_model_load: error loading model:" in log
    assert "server is listening on http" not in log


def test_exit_at_load_uses_the_given_code(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "broken", load_delay=0.0, exit_at_load=3)
    with running_sim(model, wait=False) as sim:
        assert sim.proc.wait(timeout=5) == 3
        assert "error loading model" in sim.log_text()


def test_missing_model_file_fails_like_llama_server(tmp_path: Path) -> None:
    with running_sim(tmp_path / "absent.gguf", wait=False) as sim:
        assert sim.proc.wait(timeout=5) == 1
        assert "failed to open GGUF file" in sim.log_text()


def test_crash_after_tokens_kills_the_process_mid_stream(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "crashy", load_delay=0.0, token_rate=100.0, crash_after_tokens=3)
    with running_sim(model) as sim:
        wait_healthy(sim.url)
        pieces: list[str] = []
        with (
            pytest.raises(httpx.HTTPError),
            httpx.stream(
                "POST", sim.url + "/v1/chat/completions", json=chat("go", stream=True, max_tokens=10)
            ) as response,
        ):
            for _, data in sse_events(response.iter_lines()):
                if data != "[DONE]":
                    pieces += [c["delta"].get("content") or "" for c in json.loads(data)["choices"]]
        assert sim.proc.wait(timeout=5) == 1
    assert "".join(pieces) == " tok0 tok1 tok2"


def test_sigterm_exits_promptly_unless_ignored(tmp_path: Path) -> None:
    polite = write_sim_model(tmp_path, "polite", **FAST)
    stubborn = write_sim_model(tmp_path, "stubborn", ignore_sigterm=True, **FAST)
    with running_sim(polite) as sim:
        wait_healthy(sim.url)
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=2) == 0
    with running_sim(stubborn) as sim:
        wait_healthy(sim.url)
        sim.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: SIGTERM_IGNORED in sim.log_text())  # it came, and its handler is done with it
        assert httpx.get(sim.url + "/health").status_code == 200
        assert sim.proc.poll() is None


def test_hang_health_never_answers_health(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "mute", hang_health=True, **FAST)
    with running_sim(model) as sim:
        wait_until(lambda: httpx.get(sim.url + "/v1/models").status_code == 200)  # loaded
        with socket.create_connection(("127.0.0.1", sim.port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: sim\r\n\r\n")
            # The handler says when it holds the request: from then on it only sleeps.
            wait_until(lambda: HEALTH_HELD in sim.log_text())
            with pytest.raises(BlockingIOError):
                sock.recv(1, socket.MSG_DONTWAIT)
        assert httpx.get(sim.url + "/v1/models").status_code == 200


def test_record_dir_gets_argv_and_env_through_the_launcher(tmp_path: Path) -> None:
    records = tmp_path / "records"
    model = write_sim_model(tmp_path, "rec", record_dir=records, **FAST)
    launcher = sim_launcher(tmp_path / "bin")
    port = free_port()
    argv = [str(launcher), "--host", "127.0.0.1", "--port", str(port), "-m", str(model), "-c", "2048"]
    argv += ["-np", "2", "--fit", "off", "-ngl", "99", "--cache-type-k", "q8_0", "--no-mmap"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1,3"}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc=proc)
        wait_healthy(f"http://127.0.0.1:{port}")
        props = httpx.get(f"http://127.0.0.1:{port}/props").json()
    finally:
        proc.kill()
        proc.wait()
    [record] = read_records(records)
    assert record["argv"] == argv
    assert record["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert record["env"]["HIP_VISIBLE_DEVICES"] == "1,3"
    assert record["env"]["PATH"] == os.environ["PATH"]
    assert record["pid"] == proc.pid
    assert record["port"] == port
    assert record["model"] == str(model)
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 1024


# ---------------------------------------------------------------------------------------------------------
# Pacing, slots and disconnects


def test_streamed_tokens_arrive_paced(tmp_path: Path) -> None:
    """Each token is sent as it is made: the first arrives while the slot is still generating the rest."""
    model = write_sim_model(tmp_path, "paced", load_delay=0.0, token_rate=20.0)
    with running_sim(model) as sim:
        wait_healthy(sim.url)
        pieces = []
        busy_after_first: bool | None = None
        with httpx.stream(
            "POST", sim.url + "/v1/chat/completions", json=chat("pace me", stream=True, max_tokens=16)
        ) as response:
            for _, data in sse_events(response.iter_lines()):
                if data != "[DONE]" and json.loads(data)["choices"][0]["delta"].get("content"):
                    pieces.append(data)
                    if busy_after_first is None:
                        busy_after_first = slot_busy(sim.url)
        assert not slot_busy(sim.url)
    assert len(pieces) == 16
    assert busy_after_first  # 15 tokens (three quarters of a second) were still to come


def test_stream_disconnect_frees_the_only_slot(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "long", load_delay=0.0, token_rate=20.0, tokens=200)
    with running_sim(model, slots=1) as sim:
        wait_healthy(sim.url)
        with httpx.stream("POST", sim.url + "/completion", json={"prompt": "a", "stream": True}) as response:
            for n, (_, data) in enumerate(sse_events(response.iter_lines()), 1):
                assert json.loads(data)["content"]
                if n == 2:
                    break
        reply = httpx.post(sim.url + "/completion", json={"prompt": "b", "n_predict": 2}, timeout=10)
        assert reply.status_code == 200
        assert reply.json()["content"] == " tok0 tok1"
        assert not slot_busy(sim.url)
        # The first request let go of the slot cut short (it had about 10 s to go), not at its end.
        assert "cancelled" in sim.log_text()


def test_non_stream_and_queued_disconnects_free_the_slot(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "long", load_delay=0.0, token_rate=20.0, tokens=200)
    body = {"prompt": "hold the slot", "n_predict": 200}
    with running_sim(model, slots=1, extra=("--metrics",)) as sim:
        wait_healthy(sim.url)
        holder = raw_post(sim.port, "/completion", body)
        wait_until(lambda: slot_busy(sim.url))
        queued = raw_post(sim.port, "/completion", body)
        metrics_url = sim.url + "/metrics"
        wait_until(lambda: "llamacpp:requests_deferred 1" in httpx.get(metrics_url).text)
        queued.close()
        wait_until(lambda: "llamacpp:requests_deferred 0" in httpx.get(metrics_url).text, timeout=2)
        holder.close()
        reply = httpx.post(sim.url + "/completion", json={"prompt": "next", "n_predict": 1}, timeout=10)
        assert reply.status_code == 200
        # The holder let go of the slot cut short (it had about 10 s to go), not at its end.
        assert "cancelled" in sim.log_text()


def test_requests_queue_for_a_slot_in_arrival_order(tmp_path: Path) -> None:
    """Three requests for one slot run one at a time, in the order they came. Each prompt continues the
    one before it and its reply, so the prompt cache tells the order they ran in: in order, the third
    finds 12 tokens of its prompt cached (left by the second); had it overtaken the second, 6 (left by the
    first)."""
    model = write_sim_model(tmp_path, "queue", load_delay=0.0, token_rate=50.0, tokens=5)
    reply_words = "tok0 tok1 tok2 tok3 tok4"
    prompts = {"first": "a", "second": f"a {reply_words} b", "third": f"a {reply_words} b {reply_words} c"}

    def arrived() -> int:
        """Requests given a slot or waiting for one (the log first: a request moving on is missed, never
        counted twice)."""
        launched = sim.log_text().count("processing task")
        return launched + deferred(sim.url)

    with running_sim(model, slots=1, extra=("--fit", "off", "--metrics")) as sim:
        wait_healthy(sim.url)
        socks = []
        for n, (name, prompt) in enumerate(prompts.items(), 1):
            socks.append((name, raw_post(sim.port, "/completion", {"prompt": prompt, "n_predict": 5})))
            wait_until(lambda n=n: arrived() >= n)  # in before the next is sent
        cached: dict[str, int] = {}
        for name, sock in socks:
            status, reply = read_response(sock)
            sock.close()
            assert status == 200
            assert reply["content"] == " " + reply_words
            cached[name] = reply["timings"]["cache_n"]
    assert cached == {"first": 0, "second": 6, "third": 12}


# ---------------------------------------------------------------------------------------------------------
# Replies and shapes


def test_context_overflow_is_400(tmp_path: Path) -> None:
    model = write_sim_model(tmp_path, "small", **FAST)
    with running_sim(model, ctx=64, slots=2) as sim:
        wait_healthy(sim.url)
        words = " ".join(f"w{i}" for i in range(30))
        too_long = httpx.post(sim.url + "/completion", json={"prompt": words, "n_predict": 10})
        assert too_long.status_code == 400
        error = too_long.json()["error"]
        assert error["code"] == 400
        assert "exceeds the available context size" in error["message"]
        assert error["n_ctx"] == 32
        fits = httpx.post(sim.url + "/completion", json={"prompt": words, "n_predict": 2})
        assert fits.status_code == 200


def test_messages_stream_event_sequence(fast_sim: SimRun) -> None:
    body = {"model": "claude-ish", "max_tokens": 3, "stream": True, "system": "be brief"}
    body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    with httpx.stream("POST", fast_sim.url + "/v1/messages", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [(name, json.loads(data)) for name, data in sse_events(response.iter_lines())]
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["model"] == "claude-ish"
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == " tok0 tok1 tok2"
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"]["output_tokens"] == 3


def test_messages_non_stream_and_count_tokens(fast_sim: SimRun) -> None:
    body = {"model": "x", "max_tokens": 100, "messages": [{"role": "user", "content": "one two three"}]}
    reply = httpx.post(fast_sim.url + "/v1/messages", json=body).json()
    assert reply["type"] == "message"
    assert reply["stop_reason"] == "end_turn"
    assert reply["usage"]["output_tokens"] == 8
    counted = httpx.post(fast_sim.url + "/v1/messages/count_tokens", json=body).json()
    assert counted["input_tokens"] == reply["usage"]["input_tokens"]


def test_chat_stream_ends_with_done_and_carries_usage_and_timings(fast_sim: SimRun) -> None:
    with httpx.stream(
        "POST", fast_sim.url + "/v1/chat/completions", json=chat("hi there", stream=True, max_tokens=2)
    ) as response:
        datas = [data for _, data in sse_events(response.iter_lines())]
    assert datas[-1] == "[DONE]"
    last = json.loads(datas[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["model"] == "m"
    assert last["usage"]["completion_tokens"] == 2
    assert set(last["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"}


def test_prompt_cache_counts_the_shared_prefix(fast_sim: SimRun) -> None:
    url = fast_sim.url
    base = "the quick brown fox jumps over the lazy dog " * 3
    first = httpx.post(url + "/completion", json={"prompt": base + "alpha", "n_predict": 1, "id_slot": 1})
    second = httpx.post(
        url + "/completion", json={"prompt": base + "beta gamma", "n_predict": 1, "id_slot": 1}
    )
    shared = len(base.split())
    assert first.json()["id_slot"] == 1
    assert second.json()["timings"]["cache_n"] == shared
    assert second.json()["timings"]["prompt_n"] == 2
    tokens = httpx.post(url + "/tokenize", json={"content": base + "beta gamma"}).json()["tokens"]
    assert len(tokens) == second.json()["tokens_evaluated"] == shared + 2
    text = httpx.post(url + "/detokenize", json={"tokens": tokens}).json()["content"]
    assert text.split() == (base + "beta gamma").split()


def test_openai_completions_and_stop_strings(fast_sim: SimRun) -> None:
    reply = httpx.post(
        fast_sim.url + "/v1/completions", json={"model": "c", "prompt": "x y", "stop": [" tok3"]}
    ).json()
    assert reply["object"] == "text_completion"
    assert reply["choices"][0]["text"] == " tok0 tok1 tok2"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] == 2


def test_responses_stream_and_non_stream(fast_sim: SimRun) -> None:
    body = {"model": "r", "input": "hello", "max_output_tokens": 2}
    reply = httpx.post(fast_sim.url + "/v1/responses", json=body).json()
    assert reply["object"] == "response"
    assert reply["output"][0]["content"][0]["text"] == " tok0 tok1"
    with httpx.stream("POST", fast_sim.url + "/v1/responses", json={**body, "stream": True}) as response:
        names = [name for name, _ in sse_events(response.iter_lines())]
    assert names[0] == "response.created"
    assert names.count("response.output_text.delta") == 2
    assert names[-1] in ("response.completed", "response.incomplete")


def test_embeddings_rerank_and_metadata(fast_sim: SimRun) -> None:
    url = fast_sim.url
    emb = httpx.post(url + "/v1/embeddings", json={"input": ["a b", "c"]}).json()
    assert [len(d["embedding"]) for d in emb["data"]] == [8, 8]
    again = httpx.post(url + "/v1/embeddings", json={"input": "a b"}).json()
    assert again["data"][0]["embedding"] == emb["data"][0]["embedding"]
    ranked = httpx.post(
        url + "/v1/rerank", json={"query": "red apple", "documents": ["blue sky", "red apple"]}
    )
    assert ranked.json()["results"][0]["index"] == 1
    slots = httpx.get(url + "/slots").json()
    assert [s["n_ctx"] for s in slots] == [512, 512]
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "fast"
    template = httpx.post(url + "/apply-template", json={"messages": [{"role": "user", "content": "q"}]})
    assert "q" in template.json()["prompt"]
    metrics = httpx.get(url + "/metrics").text
    assert "llamacpp:prompt_tokens_total" in metrics
    assert "llamacpp:tokens_predicted_total" in metrics
    assert httpx.post(url + "/v1/chat/completions", content=b"{nope").status_code == 400


def test_a_gguf_file_takes_its_behaviour_from_the_sidecar(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    write_sim_sidecar(model, name="tiny-sim", load_delay=0.0, tokens=2, token_rate=None)
    with running_sim(model) as sim:
        wait_healthy(sim.url)
        assert httpx.get(sim.url + "/v1/models").json()["data"][0]["id"] == "tiny-sim"
        assert httpx.get(sim.url + "/props").json()["model_path"] == str(model)
        assert httpx.post(sim.url + "/completion", json={"prompt": "p"}).json()["content"] == " tok0 tok1"


def test_unknown_behaviour_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="tokens_per_second"):
        write_sim_model(tmp_path, "typo", tokens_per_second=3)
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens_per_second": 3}')
    with running_sim(bad, wait=False) as sim:
        assert sim.proc.wait(timeout=5) == 1
        assert "unknown behaviour keys: tokens_per_second" in sim.log_text()
