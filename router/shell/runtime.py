"""The owner task: the only place where the scheduler's state lives and changes.

Everything that happens (a request arrives, a client leaves, a replica becomes ready or exits, a deadline
falls due) becomes an event on one memory channel. The owner task feeds each event to ``step()`` and carries
out the commands it returns: it starts and stops processes through the Supervisor, and it wakes the HTTP
handlers that wait for a decision about their request.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import trio

from router.config.load import Config, config_dir
from router.config.source import ConfigSource
from router.deploy.deployment import Deployment
from router.deploy.launch import ModelLaunch
from router.deploy.peer_settings import with_peers
from router.deploy.rpc_devices import local_gpus
from router.hosts.gpu_monitor import GpuMonitor, Ours
from router.journal.records import RequestRecord
from router.shell.foreign_watch import watch_foreign
from router.shell.happenings import HappeningKind, Happenings, Listener
from router.shell.kv_policy import kv_launch, saves_before_stop
from router.shell.kv_slots import KvAction, describe_kv
from router.shell.kv_store import KvStore
from router.shell.load_progress import LoadProgressTracker
from router.shell.peers import PeerDirectory
from router.shell.ports import free_port
from router.shell.processes import (
    LaunchSpec,
    ProcessSupervisor,
    ReplicaKv,
    SupervisorEvent,
    SupervisorFactory,
)
from router.shell.quota import OverLimit, Quotas
from router.shell.replica_logs import ReplicaLogs
from router.shell.rpc_probe import RpcProbe
from router.shell.supervisor import Supervisor
from router.shell.ticket import Ticket, record_of
from statemachine import (
    At,
    ClientGone,
    Command,
    Dispatch,
    DispatchFailed,
    Event,
    Forward,
    IllegalEvent,
    Kill,
    LoadFailed,
    LoadRequested,
    PeerFailed,
    Reject,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestClass,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Spawn,
    Startup,
    State,
    Stopped,
    Tick,
    UnloadRequested,
    WakeAt,
    initial_state,
    queries,
    ready_replicas,
    step,
)

log = logging.getLogger("router")


RecordListener = Callable[[RequestRecord], None]


class Router:
    """The owner task and its state. ``supervisor`` builds the process supervisor, given the callback its
    reports go to (None: the real one, with the configured replica logs). ``strict`` makes an event the
    scheduler refuses raise its ``IllegalEvent`` out of the owner task instead of being logged and dropped
    (the shell and the scheduler disagree). Production runs non-strict."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        gpus: GpuMonitor | None = None,
        source: ConfigSource | None = None,
        supervisor: SupervisorFactory | None = None,
        strict: bool = False,
    ) -> None:
        self.deployment = deployment
        self.source = source  # where a reload reads the configuration (None: the config file again)
        self.gpus = gpus or GpuMonitor()
        self.strict = strict
        # Peers are other routers on the network: no proxy from the environment stands between them.
        self.peer_http = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(10.0, connect=5.0))
        self.peers = PeerDirectory(deployment.config, self.peer_http, self.submit, self._peers_changed)
        self.state: State = initial_state(self.settings_for(deployment), trio.current_time())
        router = deployment.config.router
        self.load_timeout = router.load_timeout
        self.stop_timeout = router.stop_timeout
        self.supervisor: ProcessSupervisor
        if supervisor is None:
            files = ReplicaLogs(
                router.replica_logs, keep=router.replica_log_files, max_bytes=router.replica_log_max_mib << 20
            )
            self.supervisor = Supervisor(self._from_supervisor, log_lines=router.log_lines, log_files=files)
        else:
            self.supervisor = supervisor(self._from_supervisor)
        self.kv_store = KvStore(router.kv_store_dir, router.kv_store_mib << 20)
        self.rpc_probe = RpcProbe()  # whether each rpc-server answers (probed by the observers)
        self.tickets: dict[int, Ticket] = {}
        self.ports: dict[int, int] = {}
        self.happenings = Happenings()
        self.progress = LoadProgressTracker()  # how far each loading replica has come, read on demand
        # Called with a replica's port as it is told to stop: clients close their idle kept-alive connections
        # to it, which would otherwise hold up llama-server's exit (and so a swap) by about 0.1 s.
        self.stop_listeners: list[Callable[[int], None]] = []
        self.record_listeners: list[RecordListener] = []
        self.quotas = Quotas(deployment.config.keys)  # named keys' requests_per_minute and tokens_per_day
        self.record_listeners.append(self.quotas.record)
        self.stopped = trio.Event()
        self._changed = trio.Event()
        self._send, self._recv = trio.open_memory_channel[Event](math.inf)
        self._next_rid = 1
        self._timer_scope: trio.CancelScope | None = None
        self._wake_at = math.inf

    @property
    def listeners(self) -> list[Listener]:
        """Called with each happening as it is noted (the metrics)."""
        return self.happenings.listeners

    @property
    def config(self) -> Config:
        return self.deployment.config

    @property
    def launches(self) -> Mapping[str, ModelLaunch]:
        return self.deployment.launches

    @property
    def plan_document(self) -> Mapping[str, Any]:
        return self.deployment.plan_document

    # ------------------------------------------------------------------------------- lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.supervisor.run)
                nursery.start_soon(self._owner)
                nursery.start_soon(self._timer)
                nursery.start_soon(self.peers.run)
                nursery.start_soon(watch_foreign, self.gpus, lambda: self.state, self.our_pids, self.submit)
                self.submit(Startup())
                for model in self.config.router.preload:
                    self.submit(LoadRequested(model))
                task_status.started()
                await self.stopped.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.peer_http.aclose()

    def settings_for(self, deployment: Deployment) -> Settings:
        """The scheduler's settings: the deployment's, with the models of the peers as known now."""
        return with_peers(deployment.config, deployment.settings, self.peers.found)

    def peer_model(self, name: str) -> str | None:
        """The model a peer serves under ``name`` or one of its aliases, as the scheduler knows it now."""
        models = self.state.settings.models
        model = name if name in models else self.peers.aliases().get(name)
        return model if model is not None and model in models and models[model].remote else None

    def _peers_changed(self) -> None:
        self.submit(SettingsChanged(self.settings_for(self.deployment)))

    async def shutdown(self, grace: float) -> None:
        """Stop admitting, let in-flight work finish for up to ``grace`` seconds, then stop every replica."""
        self.submit(ShutdownRequested(trio.current_time() + grace))
        await self.stopped.wait()

    # ---------------------------------------------------------------------------- handler side
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
        """A new request for ``target``; ``prefix`` is its prefix chain (router.http.prefix_key), which only
        steers which free replica serves it; ``local_only``: it came through another router (hop header), so
        no peer may serve it; ``key`` and ``klass``: its client's key name and its priority class;
        ``outside``: the pool members its key may not use; ``keep_alive``: the idle time it asks for the model
        that serves it."""
        rid = self._next_rid
        self._next_rid += 1
        ticket = Ticket(
            rid,
            target,
            asked,
            endpoint,
            client,
            time.time(),
            owner=self,
            body=body,
            tokens=tokens,
            prefix=prefix,
            local_only=local_only,
            key=key,
            klass=klass,
            outside=outside,
            keep_alive=keep_alive,
        )
        self.tickets[rid] = ticket
        ticket.arrive()
        return ticket

    def ended(self, ticket: Ticket, completed: bool) -> None:
        """A ticket's handler ended it: its record goes to the history and the metrics."""
        self._record(ticket, completed)

    def forget(self, rid: int) -> None:
        """The one place a ticket is dropped: its handler is done and the scheduler has let go of it."""
        self.tickets.pop(rid, None)

    def ready_port(self, models: tuple[str, ...] | list[str]) -> int | None:
        """The port of a ready replica of the first of ``models`` that has one."""
        for replica in ready_replicas(self.state, models):
            if replica.id in self.ports:
                return self.ports[replica.id]
        return None

    def _record(self, ticket: Ticket, completed: bool) -> None:
        if not self.record_listeners:
            return
        try:
            record = record_of(ticket, completed=completed)
        except Exception:
            log.exception("could not build the record of request %d", ticket.rid)
            return
        self.publish(record)

    def publish(self, record: RequestRecord) -> None:
        """Hand a finished request's record to the history and the metrics; their faults stay theirs."""
        for listener in self.record_listeners:
            try:
                listener(record)
            except Exception:
                log.exception("a request-record listener failed")

    def submit_shutdown_now(self) -> None:
        self.submit(ShutdownRequested(trio.current_time()))

    def submit(self, event: Event) -> None:
        self._send.send_nowait(event)

    async def wait_until(self, predicate: Callable[[State], bool]) -> None:
        while not predicate(self.state):
            await self._changed.wait()

    # ------------------------------------------------------------------------------ owner task
    async def _owner(self) -> None:
        async for event in self._recv:
            self.feed(event)

    def feed(self, event: Event) -> None:
        now = trio.current_time()
        # A handler's RequestFinished/ClientGone can arrive after the scheduler let go of the request itself
        # (its replica exited first).
        let_go = (
            isinstance(event, ClientGone | RequestFinished | DispatchFailed | PeerFailed)
            and event.rid not in self.state.requests
        )
        if now > self.state.now and not let_go and not isinstance(event, Tick):
            self._step(At(now, event))  # the Tick(now) and the event in one step
        else:
            if now > self.state.now:
                self._step(Tick(now))
            # A timer Tick that waited in the channel behind other events is older than the clock by now;
            # the Tick(now) above has already done its work.
            stale_tick = isinstance(event, Tick) and event.now <= self.state.now
            if not (stale_tick or let_go):
                self._step(event)
        if isinstance(event, ClientGone | RequestFinished) and event.rid not in self.state.requests:
            self.forget(event.rid)
        self._changed.set()
        self._changed = trio.Event()

    def _step(self, event: Event) -> None:
        try:
            self.state, commands = step(self.state, event)
        except IllegalEvent as exc:
            if self.strict:
                raise
            log.error("scheduler refused an event: %s", exc)
            return
        for command in commands:
            self._carry_out(command)

    def _carry_out(self, command: Command) -> None:
        match command:
            case Dispatch(rid=rid, replica=replica):
                self.tickets[rid].sent(command, self.ports.get(replica))
            case Forward(rid=rid):
                self.tickets[rid].sent(command, None)
            case Reject(rid=rid):
                ticket = self.tickets.get(rid)
                if ticket is None:
                    return
                log.info(
                    "refused request %d for %s: %s: %s", rid, ticket.target, command.code, command.message
                )
                ticket.rejected(command)
            case Spawn():
                self._spawn(command)
            case Kill(replica=replica, model=model, reason=reason, cause=cause):
                self.happenings.note(HappeningKind.STOP, model, replica, reason, cause)
                found = queries.find_replica(self.state, replica)
                save = saves_before_stop(self.deployment, found, cause)
                port = self.ports.get(replica)
                if port is not None:
                    for stop_listener in self.stop_listeners:
                        stop_listener(port)
                self.supervisor.kill(replica, reason, save=save)
            case WakeAt(at=at):
                self._wake_at = at
                if self._timer_scope is not None:
                    self._timer_scope.deadline = at
            case Stopped():
                self.stopped.set()

    def _spawn(self, command: Spawn) -> None:
        launch = self.launches[command.model].on(command.gpus)
        shortfall = self._memory_shortfall(command)
        if shortfall is not None:
            # Other programs took the memory this replica was planned for: refuse the load with the sums
            # instead of starting a process into an out-of-memory. No process exists, so it has exited.
            self.happenings.note(HappeningKind.LOAD_REFUSED, command.model, command.replica, shortfall)
            self.submit(LoadFailed(command.replica, shortfall))
            self.submit(ReplicaExited(command.replica, "not started: " + shortfall))
            return
        port = free_port()
        self.ports[command.replica] = port
        argv = launch.argv(port)
        ticket = self.tickets.get(command.request) if command.request is not None else None
        body = ticket.body if ticket is not None else None
        kv = kv_launch(self.deployment, self.kv_store, command.model, launch, body)
        if kv is not None:
            argv += ("--slot-save-path", str(kv.shelf))
        gpus = local_gpus(command.gpus)  # RPC devices are reached by --rpc, never masked
        spec = LaunchSpec(
            replica_id=command.replica,
            model=command.model,
            argv=argv,
            env=launch.environment(gpus, self.deployment.masks),
            port=port,
            load_timeout=self.load_timeout,
            stop_timeout=self.stop_timeout,
            cwd=self._replica_dir(),
            hang_timeout=self.config.router.hang_timeout,
            kv=kv,
        )
        self.happenings.note(HappeningKind.LOAD, command.model, command.replica, command.reason)
        self.supervisor.spawn(spec)

    def _replica_dir(self) -> str | None:
        """Where replicas start: the config file's directory, so that relative paths in llama-server flags
        (``mmproj``, ``model-draft``, ...) mean what they mean in the config file."""
        folder = config_dir(self.config)
        return str(folder) if folder.is_dir() else None

    def our_pids(self) -> Ours:
        """Per GPU, the process ids of our live replica processes there; GPUs without one are absent (a
        replica whose process has not started yet, or has exited, holds no memory)."""
        ours: dict[int, set[int]] = {}
        for replica in self.state.replicas:
            info = self.supervisor.info(replica.id)
            if info is None or info.pid is None or info.exited:
                continue
            for gpu in replica.gpus:
                ours.setdefault(gpu, set()).add(info.pid)
        return ours

    def _memory_shortfall(self, command: Spawn) -> str | None:
        """Why the replica of ``command`` must not start (memory others took since planning), or None."""
        if not command.gpus:
            return None
        state = self.state
        need = {gpu: queries.used(state, gpu) for gpu in command.gpus}
        planned = {gpu: state.settings.budget(gpu) for gpu in command.gpus}
        ours = self.our_pids()
        try:
            return self.gpus.shortfall(command.model, need, planned, ours)
        except Exception as exc:  # never let a measurement problem stop a load
            log.warning("GPU memory check before loading %s failed: %s", command.model, exc)
            return None

    def _from_supervisor(self, report: SupervisorEvent) -> None:
        self.progress.forget(report.replica)  # every report ends a load or comes after its end
        match report:
            case ReplicaReady(replica=replica):
                self.happenings.note(
                    HappeningKind.READY, self._model_of(replica), replica, "answered /health"
                )
                self.submit(report)
            case LoadFailed(replica=replica, reason=reason):
                self.happenings.note(HappeningKind.LOAD_FAILED, self._model_of(replica), replica, reason)
                self.submit(report)
            case ReplicaUnresponsive(replica=replica, reason=reason):
                self.happenings.note(HappeningKind.UNRESPONSIVE, self._model_of(replica), replica, reason)
                self.submit(report)
            case ReplicaKv(replica=replica, result=result):
                kind = HappeningKind.KV_SAVE if result.action is KvAction.SAVE else HappeningKind.KV_RESTORE
                self.happenings.note(kind, self._model_of(replica), replica, describe_kv(result), kv=result)
            case ReplicaExited(replica=replica, reason=reason):
                info = self.supervisor.info(replica)  # current: the report is made before the task retires
                asked = info is not None and info.stop_reason is not None
                during_load = info is None or not info.ready
                kind = HappeningKind.LOAD_FAILED if during_load and not asked else HappeningKind.EXITED
                self.happenings.note(kind, self._model_of(replica), replica, reason, asked=asked)
                self.ports.pop(replica, None)
                self.submit(report)

    def _model_of(self, replica: int) -> str:
        found = queries.find_replica(self.state, replica)
        if found is not None:
            return found.model
        info = self.supervisor.info(replica)
        return info.model if info is not None else "?"

    async def _timer(self) -> None:
        while True:
            with trio.CancelScope(deadline=self._wake_at) as scope:
                self._timer_scope = scope
                await trio.sleep_forever()
            self._timer_scope = None
            self._wake_at = math.inf
            self.submit(Tick(trio.current_time()))

    # --------------------------------------------------------------------------------- reading
    def redeploy(self, deployment: Deployment, changed: frozenset[str]) -> None:
        """Switch to a new deployment: ``changed`` models drain and stop; the rest keep serving."""
        self.deployment = deployment
        self.peers.reconfigure(deployment.config)
        self.quotas.configure(deployment.config.keys)
        self.submit(SettingsChanged(self.settings_for(deployment), changed))

    def unload(self, model: str | None, force: bool) -> None:
        self.submit(UnloadRequested(model, force))

    def load(self, model: str) -> None:
        self.submit(LoadRequested(model))

    def quota_headers(self, key: str) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers for an answer to the key named ``key`` (none without limits)."""
        return self.quotas.standing(key, time.time())

    def quota_refusal(self, key: str) -> OverLimit | None:
        """The 429 for a request of the key named ``key`` over its requests_per_minute or tokens_per_day,
        else None (and it counts). While the whole queue is full nothing counts: the scheduler answers 503."""
        if self.state.waiting >= self.state.settings.policy.queue_limit:
            return None
        return self.quotas.refusal(key, time.time())
