"""GET /metrics: the text parses as Prometheus exposition and the numbers follow real traffic through the
router (simulated llama-servers as replicas)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from router.config.load import config_from_dict
from router.hosts.gpu_readers import GpuReading, NvmlSource
from router.journal.records import RequestRecord
from router.journal.usage import UsageSniffer
from router.observe.gpu_sampler import GpuSampler
from router.observe.metrics import CACHE_MISS_MIN_PROMPT, STOP_LABELS, RouterMetrics, stop_label
from router.serve.server import build_router
from router.shell.views import RouterView
from statemachine import KillCause
from statemachine.queries import queued, used
from tests.support.browser import gguf_router
from tests.support.client import chat_body, start_stream, stream
from tests.support.harness import running_router
from tests.support.simtools import sim_launcher, write_sim_model
from tests.support.waiting import until

GIB = 1024**3

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition text, keyed by (sample name, labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; 0 when absent (a counter that never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def matching(samples: Samples, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """Samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return [(dict(lab), v) for (n, lab), v in samples.items() if n == name and want <= set(lab)]


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def usage_of_stream(events: Iterable[Any]) -> dict[str, Any]:
    for event in events:
        if event.data and '"usage"' in event.data:
            return dict(event.json()["usage"])
    raise AssertionError("the stream carried no usage")


async def test_counters_follow_requests_tokens_and_loads(tmp_path: Path) -> None:
    models = {"alpha": {"metrics": True, "sim": {"tokens": 6}}}
    async with running_router(tmp_path, models) as h:
        before = await scrape(h.client)
        assert {
            "llama_router_queue_depth",
            "llama_router_queue_oldest_age_seconds",
            "llama_router_replicas",
            "llama_router_slots_in_use",
            "llama_router_gpu_memory_predicted_bytes",
            "llama_router_history_rows_lost_total",
        } <= names(before)
        assert value(before, "llama_router_replicas", model="alpha", state="ready") == 0
        assert not matching(before, "llama_router_requests_total")
        assert not any(n.endswith("_created") for n in names(before))

        usages = []
        prompt = "the same words again and again so that the prompt cache has something to reuse"
        for _ in range(2):
            reply = await h.client.post("/v1/chat/completions", json=chat_body("alpha", prompt))
            assert reply.status_code == 200
            usages.append(reply.json()["usage"])
        streamed = await stream(h.client, "/v1/chat/completions", chat_body("alpha", prompt))
        assert streamed.status == 200 and streamed.done
        usages.append(usage_of_stream(streamed.events))
        missing = await h.client.post("/v1/chat/completions", json=chat_body("nope"))
        assert missing.status_code == 404

        # The replica counts a reply's tokens in its own /metrics after the last chunk: scrape once it has.
        generated = sum(u["completion_tokens"] for u in usages)

        async def settled() -> Samples | None:
            doc = await scrape(h.client)
            counted = sum(v for _, v in matching(doc, "llamacpp:tokens_predicted_total", model="alpha"))
            return doc if counted == generated else None

        after = await until(settled, what="the replica's own token count")
        state = h.router.state

    chat = "/v1/chat/completions"
    assert value(after, "llama_router_requests_total", model="alpha", endpoint=chat, status="200") == 3
    assert value(after, "llama_router_requests_total", model="", endpoint=chat, status="404") == 1
    assert value(after, "llama_router_request_duration_seconds_count", model="alpha", endpoint=chat) == 3
    assert value(after, "llama_router_time_to_first_token_seconds_count", model="alpha") == 1
    assert value(after, "llama_router_queue_wait_seconds_count", model="alpha") == 3
    prompt_total = sum(u["prompt_tokens"] for u in usages)
    generated_total = sum(u["completion_tokens"] for u in usages)
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert sum(cached) > 0, "the repeated prompt should have hit the replica's prompt cache"
    assert value(after, "llama_router_prompt_tokens_total", model="alpha") == prompt_total
    assert value(after, "llama_router_generated_tokens_total", model="alpha") == generated_total == 18
    assert value(after, "llama_router_cached_prompt_tokens_total", model="alpha") == sum(cached)
    assert value(after, "llama_router_prompt_cache_hits_total", model="alpha") == sum(1 for c in cached if c)
    # The load: counted once, its duration observed once (ready), the replica ready with its one slot free.
    assert value(after, "llama_router_loads_total", model="alpha") == 1
    assert value(after, "llama_router_load_duration_seconds_count", model="alpha", outcome="ready") == 1
    assert value(after, "llama_router_load_duration_seconds_sum", model="alpha", outcome="ready") > 0
    assert value(after, "llama_router_replicas", model="alpha", state="ready") == 1
    assert value(after, "llama_router_slots", model="alpha") == 1
    assert value(after, "llama_router_slots_in_use", model="alpha") == 0
    assert value(after, "llama_router_queue_depth", target="alpha") == 0
    # The replica runs with --metrics: its own series come back labelled with model and replica.
    (replica,) = [r.id for r in state.replicas]
    labels = {"model": "alpha", "replica": str(replica)}
    assert value(after, "llama_router_replica_metrics_up", **labels) == 1
    assert value(after, "llamacpp:tokens_predicted_total", **labels) == generated_total
    assert value(after, "llamacpp:requests_processing", **labels) == 0
    assert value(after, "llama_router_history_rows_lost_total") == 0


async def test_queue_loading_and_busy_slots_are_read_at_scrape_time(tmp_path: Path) -> None:
    models = {"slow": {"sim": {"load_delay": 1.5, "tokens": 400, "token_rate": 100.0}}}
    async with running_router(tmp_path, models) as h, trio.open_nursery() as nursery:
        pending = start_stream(nursery, h.client, chat_body("slow"))
        await h.wait_state(lambda s: any(r.phase == "loading" for r in s.replicas) and len(queued(s)) == 1)
        loading = await scrape(h.client)
        still_loading = await scrape(h.client)
        await pending.first_token.wait()
        busy = await scrape(h.client)
        nursery.cancel_scope.cancel()

    assert value(loading, "llama_router_queue_depth", target="slow") == 1
    # Read at scrape time: the same request is older at the next scrape.
    age = value(loading, "llama_router_queue_oldest_age_seconds")
    assert 0 < age < value(still_loading, "llama_router_queue_oldest_age_seconds")
    assert value(loading, "llama_router_replicas", model="slow", state="loading") == 1
    assert value(loading, "llama_router_replicas", model="slow", state="ready") == 0
    assert value(busy, "llama_router_queue_depth", target="slow") == 0
    assert value(busy, "llama_router_queue_oldest_age_seconds") == 0
    assert value(busy, "llama_router_replicas", model="slow", state="ready") == 1
    assert value(busy, "llama_router_slots_in_use", model="slow") == 1
    assert value(busy, "llama_router_requests_in_flight") == 1


async def test_evictions_and_load_failures_are_counted(tmp_path: Path) -> None:
    models = {"a": {}, "b": {}, "bad": {"sim": {"oom_at_load": True}}}
    async with running_router(tmp_path, models, router={"max_models_per_gpu": 1}) as h:
        for name in ("a", "b"):
            assert (await h.client.post("/v1/chat/completions", json=chat_body(name))).status_code == 200
        failed = await h.client.post("/v1/chat/completions", json=chat_body("bad"))
        assert failed.status_code == 503
        samples = await scrape(h.client)

    assert value(samples, "llama_router_evictions_total", model="a") == 1
    assert value(samples, "llama_router_replica_stops_total", model="a", reason="evicted") == 1
    assert value(samples, "llama_router_evictions_total", model="b") == 1  # evicted to load 'bad'
    assert value(samples, "llama_router_loads_total", model="bad") == 1
    assert value(samples, "llama_router_load_failures_total", model="bad") == 1
    assert value(samples, "llama_router_load_duration_seconds_count", model="bad", outcome="failed") == 1
    assert value(samples, "llama_router_load_duration_seconds_count", model="bad", outcome="ready") == 0
    assert value(samples, "llama_router_load_failures_total", model="a") == 0
    chat = "/v1/chat/completions"
    assert value(samples, "llama_router_requests_total", model="bad", endpoint=chat, status="503") == 1


async def test_gpu_memory_gauges_use_the_predicted_needs_and_budgets(tmp_path: Path) -> None:
    models = {"llama-8b": {"gpus": [0]}, "qwen-14b": {"gpus": [1]}}
    router = {"num_gpus": 2}
    devices = {"0": {"memory_mib": 16384}, "1": {"memory_mib": 16384}}
    async with gguf_router(tmp_path, models, router=router, devices=devices) as h:
        idle = await scrape(h.client)
        reply = await h.client.post("/v1/chat/completions", json=chat_body("llama-8b"))
        assert reply.status_code == 200
        loaded = await scrape(h.client)
        predicted = used(h.router.state, 0)

    assert value(idle, "llama_router_gpu_memory_predicted_bytes", gpu="0") == 0
    assert value(idle, "llama_router_gpu_memory_budget_bytes", gpu="0") == 16 * GIB
    assert predicted > GIB
    assert value(loaded, "llama_router_gpu_memory_predicted_bytes", gpu="0") == predicted
    assert value(loaded, "llama_router_gpu_memory_predicted_bytes", gpu="1") == 0
    assert value(loaded, "llama_router_gpu_resident_models", gpu="0") == 1
    nvml = NvmlSource.open()
    if nvml is None:  # no driver here: measured series are left out, not faked
        assert "llama_router_gpu_memory_used_bytes" not in names(loaded)
    else:
        nvml.close()
        assert "llama_router_gpu_memory_used_bytes" in names(loaded)


async def test_measured_gpu_readings_reach_the_timeline_and_the_metrics(tmp_path: Path) -> None:
    """With a reader in place of NVML, its numbers flow into the samples and the gauges."""
    model = write_sim_model(tmp_path, "m")
    doc = {
        "router": {
            "llama_server": str(sim_launcher(tmp_path)),
            "num_gpus": 2,
            "history_db": str(tmp_path / "h"),
            "replica_logs": str(tmp_path / "logs"),
        },
        "devices": {"1": {"memory_mib": 1024}},
        "models": {"m": {"model": str(model), "gpus": [1]}},
    }
    router = build_router(config_from_dict(doc, "test"))
    readings = {
        0: GpuReading(0, total=80 * GIB, used=3 * GIB, util=42.0),
        1: GpuReading(1, total=24 * GIB, used=GIB),
    }
    sampler = GpuSampler(RouterView(router), reader=lambda: readings)
    assert sampler.measuring
    await sampler.sample()
    await sampler.sample()
    timeline = sampler.timeline()
    assert len(timeline["t"]) == 2 and timeline["measured"] is True
    gpu0, gpu1 = timeline["gpus"]
    assert gpu0["used"] == [3 * GIB] * 2 and gpu0["total"] == [80 * GIB] * 2 and gpu0["util"] == [42.0] * 2
    assert gpu1["budget"] == [1024 * 1024**2] * 2 and gpu1["util"] == [None] * 2
    assert sampler.timeline(since=timeline["t"][-1])["t"] == []
    samples = parse((await RouterMetrics(RouterView(router), sampler=sampler).render()).decode())
    assert value(samples, "llama_router_gpu_memory_used_bytes", gpu="0") == 3 * GIB
    assert value(samples, "llama_router_gpu_memory_total_bytes", gpu="1") == 24 * GIB
    assert value(samples, "llama_router_gpu_utilization_ratio", gpu="0") == pytest.approx(0.42)
    assert not matching(samples, "llama_router_gpu_utilization_ratio", gpu="1")


async def test_the_sniffer_reads_the_same_usage_whatever_the_chunking(tmp_path: Path) -> None:
    """Replies captured from a replica give the same counts fed whole, byte by byte, in odd pieces or one
    event at a time."""
    models = {"m": {"sim": {"tokens": 9}}}
    bodies = []
    async with running_router(tmp_path, models) as h:
        for path, body in (
            ("/v1/chat/completions", chat_body("m", "one two three")),
            (
                "/v1/messages",
                {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x y"}]},
            ),
            ("/v1/responses", {"model": "m", "input": "a b c d"}),
            ("/completion", {"model": "m", "prompt": "p q r s t"}),
        ):
            streamed = await stream(h.client, path, body)
            assert streamed.status == 200, streamed.body
            plain = await h.client.post(path, json=body)
            assert plain.status_code == 200
            bodies.append((True, streamed.body))
            bodies.append((False, plain.content))
    for sse, raw in bodies:
        results = set()
        events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]  # one event per read, as a replica sends
        for pieces in [
            [raw[i : i + size] for i in range(0, len(raw), size)] for size in (len(raw), 1, 7, 100)
        ] + [events]:
            sniffer = UsageSniffer(sse=sse)
            for piece in pieces:
                sniffer.feed(piece)
            sniffer.close()
            results.add((sniffer.usage, sniffer.first_content_at is not None))
        assert len(results) == 1, (raw[:200], results)
        ((usage, saw_content),) = results
        assert usage.generated_tokens == 9
        assert usage.prompt_tokens is not None and usage.prompt_tokens > 0
        assert saw_content == sse


async def test_long_prompts_that_reuse_nothing_count_as_cache_misses(tmp_path: Path) -> None:
    doc = {
        "router": {"history_db": str(tmp_path / "h"), "replica_logs": str(tmp_path / "logs")},
        "models": {"m": {"model": str(write_sim_model(tmp_path, "m"))}},
    }
    metrics = RouterMetrics(RouterView(build_router(config_from_dict(doc, "test"))))
    long = CACHE_MISS_MIN_PROMPT
    for prompt, cached in ((long, 0), (long - 1, 0), (long, None), (long * 4, long), (long * 2, 0)):
        metrics.observe(
            RequestRecord(
                at=0.0,
                client="c",
                endpoint="/v1/chat/completions",
                model_asked="m",
                model_served="m",
                status=200,
                duration=0.1,
                prompt_tokens=prompt,
                cached_tokens=cached,
            )
        )
    samples = parse((await metrics.render()).decode())
    # a short prompt, and a reply that did not say what it reused, are no misses
    assert value(samples, "llama_router_prompt_cache_misses_total", model="m") == 2
    assert value(samples, "llama_router_prompt_cache_hits_total", model="m") == 1
    assert value(samples, "llama_router_prompt_tokens_total", model="m") == 9 * long - 1
    assert value(samples, "llama_router_cached_prompt_tokens_total", model="m") == long


def test_stop_causes_get_short_labels() -> None:
    assert stop_label(KillCause.EVICTED) == "evicted"
    assert stop_label(KillCause.IDLE_TTL) == "ttl"
    assert stop_label(KillCause.UNLOADED) == "unload"
    assert stop_label(KillCause.DRAINED) == "unload"
    assert stop_label(KillCause.SHUTDOWN) == "shutdown"
    assert stop_label(KillCause.DEADLINE) == "shutdown"
    assert stop_label(KillCause.LOAD_FAILED) == "load_failed"
    assert stop_label(KillCause.ABANDONED) == "abandoned"
    assert stop_label(KillCause.RELOAD) == "other"
    assert stop_label(KillCause.UNRESPONSIVE) == "other"
    assert stop_label(None) == "other"
    assert set(STOP_LABELS) == set(KillCause)
