"""Every counter and histogram of the router's /metrics, declared as data: name, help, labels, buckets.

``router.observe.metrics`` registers them and feeds them as requests finish and replicas change; its gauges,
read from the router's state at scrape time, are declared there.
"""

from __future__ import annotations

import attrs
from prometheus_client import Counter, Histogram

__all__ = ["CACHE_MISS_MIN_PROMPT", "DECLARED", "LATENCY_BUCKETS", "LOAD_BUCKETS", "TTFT_BUCKETS", "Declared"]

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LOAD_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# A prompt at least this long that reused no cached token counts as a prompt-cache miss; shorter ones are
# cheap to compute again and would mostly count first turns.
CACHE_MISS_MIN_PROMPT = 256


@attrs.frozen
class Declared:
    """One counter or histogram of the router, fed as requests finish and replicas change."""

    key: str
    kind: type[Counter] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


DECLARED = (
    Declared(
        "requests",
        Counter,
        "llama_router_requests",
        "Finished requests by model, endpoint and HTTP status (499: the client left first).",
        ("model", "endpoint", "status"),
    ),
    Declared(
        "duration",
        Histogram,
        "llama_router_request_duration_seconds",
        "Time from a request's arrival to the end of its reply.",
        ("model", "endpoint"),
        LATENCY_BUCKETS,
    ),
    Declared(
        "ttft",
        Histogram,
        "llama_router_time_to_first_token_seconds",
        "Time from a streamed request's arrival to its first generated content.",
        ("model",),
        TTFT_BUCKETS,
    ),
    Declared(
        "queue_wait",
        Histogram,
        "llama_router_queue_wait_seconds",
        "Time a request waited for a slot (including any model load).",
        ("model",),
        TTFT_BUCKETS,
    ),
    Declared(
        "prompt_tokens",
        Counter,
        "llama_router_prompt_tokens",
        "Prompt tokens of finished requests.",
        ("model",),
    ),
    Declared(
        "generated_tokens",
        Counter,
        "llama_router_generated_tokens",
        "Generated tokens of finished requests.",
        ("model",),
    ),
    Declared(
        "cached_tokens",
        Counter,
        "llama_router_cached_prompt_tokens",
        "Prompt tokens served from the replica's prompt cache.",
        ("model",),
    ),
    Declared(
        "key_requests",
        Counter,
        "llama_router_key_requests",
        "Finished requests by client key name ('' for anonymous and plain api_keys) and HTTP status.",
        ("key", "status"),
    ),
    Declared(
        "key_tokens",
        Counter,
        "llama_router_key_tokens",
        "Tokens of finished requests by client key name and kind (prompt, completion, cached).",
        ("key", "kind"),
    ),
    Declared(
        "key_queue_seconds",
        Counter,
        "llama_router_key_queue_wait_seconds",
        "Seconds the requests of each client key waited in the queue.",
        ("key",),
    ),
    Declared(
        "key_replica_seconds",
        Counter,
        "llama_router_key_replica_seconds",
        "Seconds from dispatch to the reply's end of each client key's requests a replica or peer served.",
        ("key",),
    ),
    Declared(
        "cache_hits",
        Counter,
        "llama_router_prompt_cache_hits",
        "Requests that reused at least one cached prompt token.",
        ("model",),
    ),
    Declared(
        "cache_misses",
        Counter,
        "llama_router_prompt_cache_misses",
        f"Requests with a prompt of at least {CACHE_MISS_MIN_PROMPT} tokens that reused no cached token.",
        ("model",),
    ),
    Declared("loads", Counter, "llama_router_loads", "Replica loads started.", ("model",)),
    Declared(
        "load_failures", Counter, "llama_router_load_failures", "Replica loads that failed.", ("model",)
    ),
    Declared(
        "load_duration",
        Histogram,
        "llama_router_load_duration_seconds",
        "Time from starting a replica to it answering /health (outcome ready) or failing (failed).",
        ("model", "outcome"),
        LOAD_BUCKETS,
    ),
    Declared(
        "evictions",
        Counter,
        "llama_router_evictions",
        "Replicas stopped to make room for another model.",
        ("model",),
    ),
    Declared(
        "kv_saves",
        Counter,
        "llama_router_kv_saves",
        "Saves of a stopping replica's slots to the prompt cache store, by outcome (saved, empty, failed, "
        "timeout).",
        ("model", "outcome"),
    ),
    Declared(
        "kv_restores",
        Counter,
        "llama_router_kv_restores",
        "Restores from the prompt cache store into a new replica, by outcome (restored, no_match, failed, "
        "timeout; a model with nothing stored is not counted).",
        ("model", "outcome"),
    ),
    Declared(
        "kv_restored_tokens",
        Counter,
        "llama_router_kv_restored_tokens",
        "Prompt tokens restored: for the state chosen for the request that loads a model, those it shares "
        "with that request's prompt; for the states put into the new replica's other slots, all they hold.",
        ("model",),
    ),
    Declared(
        "stops",
        Counter,
        "llama_router_replica_stops",
        "Replicas stopped by the router, by reason (evicted, ttl, unload, shutdown, load_failed, other).",
        ("model", "reason"),
    ),
)
"""Every counter and histogram the router declares (the gauges are read at scrape time, in
``router.observe.metrics``)."""
