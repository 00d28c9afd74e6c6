"""Narrow views of a running router, for the layers above the shell.

Handlers and observers never hold the :class:`~router.shell.runtime.Router` itself: ``RouterView`` is what
they may read (the scheduler's state, the configuration and its deployment, the happenings, the replicas'
processes and logs, the GPUs' last readings, the peers), and nothing on it changes anything. ``Desk`` adds
what a request handler does besides reading: admit a request (its ticket then owns the request's life) and
publish the record of one refused before admission. ``Admin`` holds the operator's actions. The wiring
(``router.serve.wiring``) hands each part the view it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from router.config.load import Config
from router.deploy.deployment import Deployment
from router.deploy.launch import ModelLaunch
from router.hosts.gpu_monitor import Ours
from router.journal.records import RequestRecord
from router.placement.budgets import GpuMeasure
from router.shell.happenings import Happening
from router.shell.load_progress import LoadProgress
from router.shell.processes import ReplicaProcessInfo
from router.shell.quota import OverLimit
from router.shell.replica_logs import ReplicaLogFile
from router.shell.rpc_probe import Endpoint, Reachability
from router.shell.runtime import Router
from router.shell.ticket import Ticket
from statemachine import ReplicaPhase, RequestClass, State, queries


class RouterView:
    """What may be read of a running router (a reload changes what these answer, never the view)."""

    __slots__ = ("_router",)

    def __init__(self, router: Router) -> None:
        self._router = router

    @property
    def state(self) -> State:
        """The scheduler's state as of the last event (a frozen value)."""
        return self._router.state

    @property
    def config(self) -> Config:
        return self._router.config

    @property
    def deployment(self) -> Deployment:
        return self._router.deployment

    @property
    def launches(self) -> Mapping[str, ModelLaunch]:
        return self._router.launches

    @property
    def plan_document(self) -> Mapping[str, Any]:
        return self._router.plan_document

    def happenings(self) -> Iterable[Happening]:
        """The recent happenings, oldest first."""
        return tuple(self._router.happenings)

    @property
    def ports(self) -> Mapping[int, int]:
        """The port of each replica that has one."""
        return MappingProxyType(self._router.ports)

    def replica_info(self, replica: int) -> ReplicaProcessInfo | None:
        return self._router.supervisor.info(replica)

    def replica_log_file(self, replica: int) -> ReplicaLogFile | None:
        return self._router.supervisor.log_file(replica)

    def replica_log_lines(self, replica: int) -> Iterable[str]:
        return self._router.supervisor.logs(replica)

    def gpu_reading(self, gpu: int) -> GpuMeasure | None:
        """The last memory reading of ``gpu`` (None where it cannot be read)."""
        return self._router.gpus.last.get(gpu)

    @property
    def gpu_reader_kind(self) -> str:
        return self._router.gpus.kind

    def our_pids(self) -> Ours:
        return self._router.our_pids()

    def kv_store_bytes(self) -> int:
        return self._router.kv_store.size()

    def rpc_result(self, endpoint: Endpoint) -> Reachability | None:
        return self._router.rpc_probe.results.get(endpoint)

    def peer_model(self, name: str) -> str | None:
        return self._router.peer_model(name)

    def peer_aliases(self) -> Mapping[str, str]:
        return self._router.peers.aliases()

    def peer_capabilities(self, model: str) -> tuple[str, ...]:
        """What a peer's model can do, as the peer's /v1/models says (``()``: nothing said)."""
        return self._router.peers.model_capabilities(model)

    def peer_entries(self) -> list[dict[str, Any]]:
        return self._router.peers.describe()

    def peer_status(self, name: str) -> Any:
        return self._router.peers.status.get(name)

    def ready_port(self, models: tuple[str, ...] | list[str]) -> int | None:
        return self._router.ready_port(models)

    def queue_position(self, rid: int) -> int | None:
        """1-based position of request ``rid`` among the waiting requests; None unless it waits."""
        return queries.queue_position(self.state, rid)

    def load_progress(self, replica: int) -> LoadProgress | None:
        """How far the replica ``replica`` has come with its load; None unless it is loading."""
        found = queries.find_replica(self.state, replica)
        info = self.replica_info(replica)
        if found is None or found.phase != ReplicaPhase.LOADING or info is None:
            return None
        return self._router.progress.of(info, lambda: self.replica_log_lines(replica))

    def awaited_load(self, rid: int) -> tuple[str, LoadProgress] | None:
        """The load waiting request ``rid`` waits for, as its model and progress (the furthest, when several
        replicas that may serve it load); None when it waits for no load."""
        loads = [
            (progress, replica.model)
            for replica in queries.loading_for(self.state, rid)
            if (progress := self.load_progress(replica.id)) is not None
        ]
        if not loads:
            return None
        progress, model = max(loads, key=lambda load: (load[0].fraction, load[0].seconds))
        return model, progress


class Desk(RouterView):
    """A request handler's view: reading, admitting requests, and the records of refused ones."""

    __slots__ = ()

    def admit(
        self,
        target: str,
        *,
        asked: str | None,
        endpoint: str,
        client: str,
        tokens: int | None,
        body: Mapping[str, Any] | None = None,
        prefix: tuple[int, ...] = (),
        local_only: bool = False,
        key: str = "",
        klass: RequestClass = RequestClass.STANDARD,
        outside: frozenset[str] = frozenset(),
        keep_alive: float | None = None,
    ) -> Ticket:
        """A new request for ``target``: its ticket, which owns the request's life from here."""
        return self._router.admit(
            target,
            asked=asked,
            endpoint=endpoint,
            client=client,
            tokens=tokens,
            body=body,
            prefix=prefix,
            local_only=local_only,
            key=key,
            klass=klass,
            outside=outside,
            keep_alive=keep_alive,
        )

    def publish(self, record: RequestRecord) -> None:
        self._router.publish(record)

    def limit_headers(self, key: str) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for an answer to the key named ``key`` (none without limits)."""
        return self._router.quota_headers(key) if key else {}

    def over_limit(self, key: str) -> OverLimit | None:
        """Why a request of the key named ``key`` is over its own limits, else None (and it counts)."""
        return self._router.quota_refusal(key) if key else None


class Admin(Desk):
    """The operator's actions besides a handler's: unload models, wait for the state, reach the router for a
    reload (which replaces its deployment)."""

    __slots__ = ()

    def unload(self, model: str | None, force: bool) -> None:
        self._router.unload(model, force)

    def load(self, model: str) -> None:
        self._router.load(model)

    async def wait_until(self, predicate: Callable[[State], bool]) -> None:
        await self._router.wait_until(predicate)

    @property
    def router(self) -> Router:
        """The router itself, for a reload (``router.shell.reload``) alone."""
        return self._router
