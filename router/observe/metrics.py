"""Prometheus metrics of one router (GET /metrics), on a registry of its own.

Counters and histograms (declared in ``router.observe.declared_metrics``) move as requests finish
(``observe``) and as replicas load, fail and stop (``on_happening``); ``router.observe.observers`` hands both
to the router's listeners. Gauges that
describe the present — queue, replicas, slots, GPU memory, the history's health — are read from the
router's state when scraped. Replicas started with ``--metrics`` are scraped at the same moment (1 s timeout
each) and their ``llamacpp:*`` series re-exported with the labels ``model`` and ``replica``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from router.journal.history import History
from router.journal.records import RequestRecord
from router.observe.declared_metrics import CACHE_MISS_MIN_PROMPT, DECLARED
from router.observe.gpu_sampler import GpuSampler
from router.shell.views import RouterView
from statemachine import KillCause, ReplicaPhase, queries, replica_state

log = logging.getLogger("router")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REPLICA_SCRAPE_TIMEOUT = 1.0
REPLICA_STATES = ("loading", "ready", "draining", "stopping")

STOP_LABELS: dict[KillCause, str] = {
    KillCause.EVICTED: "evicted",
    KillCause.IDLE_TTL: "ttl",
    KillCause.UNLOADED: "unload",
    KillCause.DRAINED: "unload",
    KillCause.RELOAD: "other",
    KillCause.LOAD_FAILED: "load_failed",
    KillCause.UNRESPONSIVE: "other",
    KillCause.SHUTDOWN: "shutdown",
    KillCause.DEADLINE: "shutdown",
    KillCause.ABANDONED: "abandoned",
}
"""The ``reason`` label of ``llama_router_replica_stops`` for each cause: a short, bounded set."""


def stop_label(cause: KillCause | None) -> str:
    return STOP_LABELS[cause] if cause is not None else "other"


class RouterMetrics:
    """All metrics of ``router``. ``render()`` produces the exposition text of a scrape."""

    def __init__(
        self,
        view: RouterView,
        *,
        client: httpx.AsyncClient | None = None,
        history: History | None = None,
        sampler: GpuSampler | None = None,
    ) -> None:
        self.view = view
        self.client = client
        self.history = history
        self.sampler = sampler
        self.registry = CollectorRegistry(auto_describe=False)
        self.counters: dict[str, Counter] = {}
        self.histograms: dict[str, Histogram] = {}
        for d in DECLARED:
            if d.kind is Histogram:
                self.histograms[d.key] = Histogram(
                    d.name, d.help, d.labels, buckets=d.buckets, registry=self.registry
                )
            else:
                self.counters[d.key] = Counter(d.name, d.help, d.labels, registry=self.registry)
        self._loading: dict[int, float] = {}
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._replica_families: list[Metric] = []
        self.registry.register(_StateCollector(self))

    # -------------------------------------------------------------------------------------- feeding
    def observe(self, record: RequestRecord) -> None:
        model = record.metric_model
        child = self._child
        child("requests", model, record.endpoint, str(record.status)).inc()
        child("duration", model, record.endpoint).observe(record.duration)
        if record.ttft is not None:
            child("ttft", model).observe(record.ttft)
        if record.queue_wait is not None:
            child("queue_wait", model).observe(record.queue_wait)
        if record.prompt_tokens:
            child("prompt_tokens", model).inc(record.prompt_tokens)
        if record.generated_tokens:
            child("generated_tokens", model).inc(record.generated_tokens)
        if record.cached_tokens:
            child("cached_tokens", model).inc(record.cached_tokens)
            child("cache_hits", model).inc()
        elif record.cached_tokens == 0 and (record.prompt_tokens or 0) >= CACHE_MISS_MIN_PROMPT:
            child("cache_misses", model).inc()
        key = record.key
        child("key_requests", key, str(record.status)).inc()
        for kind, tokens in (
            ("prompt", record.prompt_tokens),
            ("completion", record.generated_tokens),
            ("cached", record.cached_tokens),
        ):
            if tokens:
                child("key_tokens", key, kind).inc(tokens)
        if record.queue_wait is not None:
            child("key_queue_seconds", key).inc(record.queue_wait)
        if record.model_served is not None:
            child("key_replica_seconds", key).inc(max(0.0, record.duration - (record.queue_wait or 0.0)))

    def _child(self, family: str, *labels: str) -> Any:
        """The series of counter or histogram ``family`` with ``labels``, kept once looked up: a request's
        record moves a dozen series, and ``labels()`` builds and checks its arguments under a lock each time
        (no series is ever removed, so a kept one stays the registry's)."""
        found = self._children.get((family, labels))
        if found is None:
            metric = self.histograms[family] if family in self.histograms else self.counters[family]
            found = self._children[(family, labels)] = metric.labels(*labels)
        return found

    def on_happening(self, kind: str, data: dict[str, Any]) -> None:
        model = str(data.get("model", ""))
        replica = int(data.get("replica", 0))
        at = float(data.get("at", 0.0))
        count, hist = self.counters, self.histograms
        if kind == "load":
            count["loads"].labels(model).inc()
            self._loading[replica] = at
        elif kind == "ready":
            started = self._loading.pop(replica, None)
            if started is not None:
                hist["load_duration"].labels(model, "ready").observe(max(0.0, at - started))
        elif kind == "load_failed":
            started = self._loading.pop(replica, None)
            if started is not None:
                count["load_failures"].labels(model).inc()
                hist["load_duration"].labels(model, "failed").observe(max(0.0, at - started))
        elif kind == "stop":
            cause = data.get("cause")
            count["stops"].labels(model, stop_label(cause)).inc()
            if cause is KillCause.EVICTED:
                count["evictions"].labels(model).inc()
        elif kind == "exited":
            self._loading.pop(replica, None)
        elif kind in ("kv_save", "kv_restore") and data.get("kv"):
            result = data["kv"]
            count[kind + "s"].labels(model, str(result.get("outcome"))).inc()
            if kind == "kv_restore" and result.get("outcome") == "restored":
                count["kv_restored_tokens"].labels(model).inc(int(result.get("tokens") or 0))

    # -------------------------------------------------------------------------------------- scraping
    async def render(self) -> bytes:
        """The exposition text, after scraping the replicas that export their own metrics."""
        families = await self.scrape_replicas()
        self._replica_families = families
        try:
            return generate_latest(_WithoutCreated(self.registry))  # type: ignore[arg-type]
        finally:
            self._replica_families = []

    def replica_targets(self) -> list[tuple[str, int, int]]:
        """(model, replica id, port) of ready replicas started with ``--metrics``."""
        targets = []
        for replica in self.view.state.replicas:
            if replica.phase != ReplicaPhase.READY:
                continue
            port = self.view.ports.get(replica.id)
            info = self.view.replica_info(replica.id)
            if port is None or info is None or "--metrics" not in info.argv:
                continue
            targets.append((replica.model, replica.id, port))
        return targets

    async def scrape_replicas(self) -> list[Metric]:
        targets = self.replica_targets()
        if not targets or self.client is None:
            return []
        texts: dict[tuple[str, int], str | None] = {}

        async def fetch(model: str, replica: int, port: int) -> None:
            assert self.client is not None
            try:
                response = await self.client.get(
                    f"http://127.0.0.1:{port}/metrics", timeout=REPLICA_SCRAPE_TIMEOUT
                )
                texts[(model, replica)] = response.text if response.status_code == 200 else None
            except httpx.HTTPError:
                texts[(model, replica)] = None

        async with trio.open_nursery() as nursery:
            for model, replica, port in targets:
                nursery.start_soon(fetch, model, replica, port)
        return relabel_replica_metrics(texts)


class _WithoutCreated:
    """The registry's families without the ``*_created`` series of our own counters and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if metric.name.startswith("llama_router_") and metric.type in ("counter", "histogram"):
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def relabel_replica_metrics(texts: dict[tuple[str, int], str | None]) -> list[Metric]:
    """Merge the replicas' exposition texts into families labelled with model and replica, plus an
    ``llama_router_replica_metrics_up`` gauge (0 for replicas that did not answer)."""
    merged: dict[str, Metric] = {}
    up = GaugeMetricFamily(
        "llama_router_replica_metrics_up",
        "Whether the replica's own /metrics answered the last scrape.",
        labels=["model", "replica"],
    )
    for (model, replica), text in sorted(texts.items()):
        ok = text is not None
        if text is not None:
            try:
                families = list(text_string_to_metric_families(text))
            except ValueError:
                families, ok = [], False
            for family in families:
                target = merged.get(family.name)
                if target is None:
                    target = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = target
                elif target.type != family.type:
                    continue
                for s in family.samples:
                    labels = {**s.labels, "model": model, "replica": str(replica)}
                    target.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
        up.add_metric([model, str(replica)], 1.0 if ok else 0.0)
    return [up, *merged.values()]


class _StateCollector(Collector):
    """Gauges read from the router's state (and the history and GPU sampler) at scrape time."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        yield from self._queue()
        yield from self._replicas()
        yield from self._gpus()
        yield from self._peers()
        yield from self._history()
        yield from self.metrics._replica_families

    def _queue(self) -> Iterator[Metric]:
        view = self.metrics.view
        state = view.state
        now = trio.current_time()
        depth = GaugeMetricFamily(
            "llama_router_queue_depth", "Requests waiting for a slot, by model or pool.", labels=["target"]
        )
        counts: dict[str, int] = {name: 0 for name in (*state.settings.models, *state.settings.pools)}
        waiting = queries.queued(state)
        for request in waiting:
            counts[request.target] = counts.get(request.target, 0) + 1
        for target, count in sorted(counts.items()):
            depth.add_metric([target], count)
        yield depth
        oldest = max((now - r.arrived for r in waiting), default=0.0)
        yield GaugeMetricFamily(
            "llama_router_queue_oldest_age_seconds",
            "Age of the oldest waiting request (0 when none waits).",
            value=max(0.0, oldest),
        )
        yield GaugeMetricFamily(
            "llama_router_requests_in_flight", "Requests dispatched to a replica.", value=_in_flight(view)
        )
        yield GaugeMetricFamily(
            "llama_router_kv_store_bytes",
            "Bytes of saved slot states in the prompt cache store.",
            value=view.kv_store_bytes(),
        )

    def _replicas(self) -> Iterator[Metric]:
        state = self.metrics.view.state
        replicas = GaugeMetricFamily(
            "llama_router_replicas", "Replicas by model and state.", labels=["model", "state"]
        )
        in_use = GaugeMetricFamily(
            "llama_router_slots_in_use",
            "Slots of the model's replicas that hold a request.",
            labels=["model"],
        )
        slots = GaugeMetricFamily(
            "llama_router_slots", "Slots of the model's ready replicas.", labels=["model"]
        )
        progress = GaugeMetricFamily(
            "llama_router_replica_load_progress",
            "How far each loading replica has come with its load (0 to 1), from what its process has read.",
            labels=["model", "replica"],
        )
        for name, spec in sorted(state.settings.models.items()):
            mine = [r for r in state.replicas if r.model == name]
            for r in mine:
                if (load := self.metrics.view.load_progress(r.id)) is not None:
                    progress.add_metric([name, str(r.id)], load.fraction)
            for kind in REPLICA_STATES:
                replicas.add_metric([name, kind], sum(1 for r in mine if replica_state(r) == kind))
            in_use.add_metric([name], sum(len(r.inflight) for r in mine))
            slots.add_metric([name], spec.slots * sum(1 for r in mine if r.phase == ReplicaPhase.READY))
        yield replicas
        yield in_use
        yield slots
        yield progress

    def _peers(self) -> Iterator[Metric]:
        view = self.metrics.view
        state = view.state
        up = GaugeMetricFamily(
            "llama_router_peer_up",
            "1 while the peer answers its /v1/models read (0 before the first answer).",
            labels=["peer"],
        )
        forwarded = GaugeMetricFamily(
            "llama_router_peer_in_flight", "Requests forwarded to the peer and not finished.", labels=["peer"]
        )
        limit = GaugeMetricFamily(
            "llama_router_peer_max_in_flight", "Most requests forwarded to the peer at once.", labels=["peer"]
        )
        for name in sorted(state.settings.peers):
            status = view.peer_status(name)
            answers = status is not None and status.up is True and name not in state.peers_down
            up.add_metric([name], 1 if answers else 0)
            forwarded.add_metric([name], len(state.peer_inflight.get(name, ())))
            limit.add_metric([name], state.settings.peer_limit(name))
        yield up
        yield forwarded
        yield limit

    def _gpus(self) -> Iterator[Metric]:
        state = self.metrics.view.state
        sampler = self.metrics.sampler
        readings = sampler.readings if sampler is not None else {}
        budget = GaugeMetricFamily(
            "llama_router_gpu_memory_budget_bytes", "Declared memory budget of the GPU.", labels=["gpu"]
        )
        predicted = GaugeMetricFamily(
            "llama_router_gpu_memory_predicted_bytes",
            "Memory the scheduler predicts its resident replicas use on the GPU.",
            labels=["gpu"],
        )
        residents = GaugeMetricFamily(
            "llama_router_gpu_resident_models", "Models resident on the GPU.", labels=["gpu"]
        )
        used = GaugeMetricFamily(
            "llama_router_gpu_memory_used_bytes", "GPU memory in use as NVML reports it.", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "llama_router_gpu_memory_total_bytes", "GPU memory in all as NVML reports it.", labels=["gpu"]
        )
        util = GaugeMetricFamily(
            "llama_router_gpu_utilization_ratio",
            "GPU utilisation (0 to 1) as NVML reports it.",
            labels=["gpu"],
        )
        for device in sorted(state.settings.devices.values(), key=lambda d: d.id):
            gpu = str(device.id)
            if device.budget is not None:
                budget.add_metric([gpu], device.budget)
            predicted.add_metric([gpu], queries.used(state, device.id))
            residents.add_metric([gpu], len(queries.residents(state, device.id)))
            reading = readings.get(device.id)
            if reading is not None:
                used.add_metric([gpu], reading.used)
                total.add_metric([gpu], reading.total)
                if reading.util is not None:
                    util.add_metric([gpu], reading.util / 100.0)
        yield from (budget, predicted, residents)
        if readings:
            yield from (used, total, util)

    def _history(self) -> Iterator[Metric]:
        history = self.metrics.history
        if history is None:
            return
        yield CounterMetricFamily(
            "llama_router_history_rows_written",
            "Request records written to the history database.",
            value=history.written,
        )
        yield CounterMetricFamily(
            "llama_router_history_rows_lost",
            "Request records the history could not keep (database unwritable, disk full, buffer full).",
            value=history.lost,
        )
        yield GaugeMetricFamily(
            "llama_router_history_rows_pending",
            "Request records waiting to be written.",
            value=history.pending,
        )


def _in_flight(view: RouterView) -> int:
    return sum(len(r.inflight) for r in view.state.replicas)
