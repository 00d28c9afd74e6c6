"""Run the real router against simulated llama-servers, and watch what reaches the client.

``running_router(dir, models, ...)`` writes a configuration whose models are simulated ones (each model's
``sim`` entry holds the simulator's behaviour keys, see ``tests.support.simtools.write_sim_model``), starts
the router inside the test's Trio run on a free port and yields a :class:`RouterHandle`. ``router_process``
starts the same router as a separate ``python -m router --config FILE`` process, for tests that signal it.

``stream(client, path, body)`` sends one streamed request and keeps every server-sent event with the
``trio.current_time()`` at which it arrived, so that tests can compare when tokens of different replies
arrived instead of sleeping and hoping.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from router.config.load import Config, config_from_dict
from router.config.source import ConfigSource
from router.serve.server import build_router, run_server
from router.shell.ports import free_port
from router.shell.runtime import Router
from statemachine import State
from tests.support.simtools import sim_launcher, write_sim_model

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 15.0

# Fast defaults for the simulator: quick loads, tokens at a steady 50 per second.
SIM_DEFAULTS: Mapping[str, Any] = {"load_delay": 0.1, "tokens": 8, "token_rate": 50.0}


# ------------------------------------------------------------------------------------------ configuration


def config_document(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    port: int | None = None,
) -> dict[str, Any]:
    """The configuration document for simulated ``models``.

    Each value of ``models`` is a ``[models.NAME]`` table, except that its ``sim`` key (a dict of behaviour
    keys) describes the simulated model; ``model`` is filled in with the file written for it. Every
    simulated model records its start (argv, env) under ``dir/records/NAME`` unless ``sim`` says otherwise.
    """
    records = dir / "records"
    tables: dict[str, Any] = {}
    for name, raw in models.items():
        table = dict(raw)
        behaviour = {**SIM_DEFAULTS, "record_dir": records / name, **table.pop("sim", {})}
        if "model" not in table:  # a given file (a GGUF with a sidecar, say) is used as it is
            table["model"] = str(write_sim_model(dir / "models", name, **behaviour))
        tables[name] = table
    router_table: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port if port is not None else free_port(),
        "llama_server": str(sim_launcher(dir)),
        "history_db": str(dir / "history.db"),
        "load_timeout": 20.0,
        "stop_timeout": 3.0,
        "shutdown_grace": 10.0,
        "replica_logs": str(dir / "replica-logs"),
        **(router or {}),
    }
    doc: dict[str, Any] = {"router": router_table, "models": tables}
    if devices:
        doc["devices"] = dict(devices)
    if defaults:
        doc["defaults"] = dict(defaults)
    if pools:
        doc["pools"] = dict(pools)
    return doc


def with_replica_logs(dir: Path, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``router.replica_logs`` under ``dir`` when it names none (tests never write to the
    user's state directory)."""
    router = dict(doc.get("router") or {})
    router.setdefault("replica_logs", str(dir / "replica-logs"))
    return {**doc, "router": router}


def write_config(dir: Path, doc: Mapping[str, Any]) -> Path:
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / "router.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


# ----------------------------------------------------------------------------------------------- handles


@attrs.define(eq=False)
class RouterHandle:
    """A router running inside the test: its URL, the Router object, a client and the directories."""

    url: str
    router: Router
    config: Config
    client: httpx.AsyncClient
    dir: Path
    records: Path

    async def status(self) -> dict[str, Any]:
        response = await self.client.get("/status")
        response.raise_for_status()
        return dict(response.json())

    async def models(self) -> dict[str, Any]:
        response = await self.client.get("/v1/models")
        response.raise_for_status()
        return dict(response.json())

    async def wait_state(self, predicate: Callable[[State], bool], timeout: float = 10.0) -> State:
        """Wait until the scheduler's state satisfies ``predicate`` (woken by every event, no polling)."""
        with trio.fail_after(timeout):
            await self.router.wait_until(predicate)
        return self.router.state

    async def wait_ready(self, model: str, count: int = 1, timeout: float = 10.0) -> State:
        return await self.wait_state(
            lambda s: sum(1 for r in s.replicas if r.model == model and r.phase == "ready") >= count, timeout
        )

    async def wait_idle(self, timeout: float = 5.0) -> None:
        """Wait until the scheduler owns no request and the shell holds no ticket (nothing leaked)."""
        with trio.fail_after(timeout):
            await self.router.wait_until(lambda s: not s.requests and not self.router.tickets)

    def records_of(self, model: str) -> Path:
        return self.records / model


@contextlib.asynccontextmanager
async def running_router(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    client_timeout: float = 30.0,
) -> AsyncIterator[RouterHandle]:
    """Start the router in this Trio run against simulated ``models``; stop it (and its replicas) after."""
    doc = config_document(dir, models, router=router, devices=devices, defaults=defaults, pools=pools)
    async with serving(dir, doc, client_timeout=client_timeout) as handle:
        yield handle


@contextlib.asynccontextmanager
async def serving(
    dir: Path, doc: Mapping[str, Any], *, client_timeout: float = 30.0
) -> AsyncIterator[RouterHandle]:
    """Write the configuration document ``doc``, start the router on it in this Trio run, stop it after.

    Replica log files go to ``dir/replica-logs`` unless ``doc`` names a directory."""
    doc = with_replica_logs(dir, doc)
    write_config(dir, doc)
    config = config_from_dict(doc, dir / "router.json")
    async with serving_config(dir, config, client_timeout=client_timeout) as handle:
        yield handle


@contextlib.asynccontextmanager
async def serving_config(
    dir: Path, config: Config, *, source: ConfigSource | None = None, client_timeout: float = 30.0
) -> AsyncIterator[RouterHandle]:
    """Start the router on ``config`` in this Trio run (reloads read ``source``, else the config file)."""
    the_router = build_router(config, source)
    url = f"http://{config.router.host}:{config.router.port}"
    refusals = _RefusalWatch()
    logging.getLogger("router").addHandler(refusals)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, config, the_router)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
            async with httpx.AsyncClient(base_url=url, timeout=client_timeout, limits=limits) as client:
                await _wait_health(client)
                try:
                    yield RouterHandle(url, the_router, config, client, dir, dir / "records")
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        logging.getLogger("router").removeHandler(refusals)
    # The shell must never feed the scheduler an event it refuses: that means the two disagree.
    assert not refusals.messages, refusals.messages


class _RefusalWatch(logging.Handler):
    """Collects the router's "scheduler refused an event" log lines."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("scheduler refused"):
            self.messages.append(message)


async def _serve(config: Config, router: Router) -> None:
    await run_server(config, router=router)


async def _wait_health(client: httpx.AsyncClient, timeout: float = START_TIMEOUT) -> None:
    with trio.fail_after(timeout):
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.02)


# -------------------------------------------------------------------------------- the router as a process


@attrs.define(eq=False)
class RouterProcess:
    """``python -m router`` running in a process of its own."""

    process: trio.Process
    url: str
    client: httpx.AsyncClient
    dir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def status(self) -> dict[str, Any]:
        response = await self.client.get("/status")
        response.raise_for_status()
        return dict(response.json())

    async def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> Any:
        """Poll /status until ``predicate`` holds; return the document."""
        with trio.fail_after(timeout):
            while True:
                doc = await self.status()
                if predicate(doc):
                    return doc
                await trio.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def wait_exit(self, timeout: float = 15.0) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def router_process(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
) -> AsyncIterator[RouterProcess]:
    """Start ``python -m router --config FILE`` for simulated ``models``; kill it (if still alive) after."""
    doc = config_document(dir, models, router=router, devices=devices, defaults=defaults, pools=pools)
    async with process_serving(dir, doc) as handle:
        yield handle


@contextlib.asynccontextmanager
async def process_serving(dir: Path, doc: Mapping[str, Any]) -> AsyncIterator[RouterProcess]:
    """Write ``doc`` and start ``python -m router --config FILE`` on it; kill it (if still alive) after."""
    path = write_config(dir, doc)
    url = f"http://{doc['router']['host']}:{doc['router']['port']}"
    log_path = dir / "router.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with log_path.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "router", "--config", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
        )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            try:
                await _wait_health(client)
            except trio.TooSlowError:
                raise RuntimeError(f"the router did not start; its log:\n{log_path.read_text()}") from None
            yield RouterProcess(process, url, client, dir, log_path)
    finally:
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(5):
                await process.wait()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a process that still runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


async def wait_pid_gone(pid: int, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while pid_alive(pid):
            await trio.sleep(0.05)


# ------------------------------------------------------------------------------------------------ streams


@attrs.frozen
class SseEvent:
    """One server-sent event (or comment) and the Trio time its last byte arrived."""

    at: float
    data: str | None = None
    event: str | None = None
    comment: str | None = None

    def json(self) -> Any:
        assert self.data is not None
        return json.loads(self.data)

    @property
    def is_error(self) -> bool:
        return self.data is not None and self.data.startswith("{") and '"error"' in self.data[:20]

    @property
    def is_done(self) -> bool:
        return self.data == "[DONE]"


@attrs.define(eq=False)
class StreamResult:
    """What a streamed request got: status, headers, events with arrival times, and when it began/ended."""

    status: int
    headers: httpx.Headers
    sent_at: float
    events: list[SseEvent] = attrs.field(factory=list)
    body: bytes = b""
    ended_at: float | None = None
    dropped: bool = False

    @property
    def comments(self) -> list[SseEvent]:
        return [e for e in self.events if e.comment is not None]

    @property
    def tokens(self) -> list[SseEvent]:
        """Data events that carry generated text (not errors, not the final [DONE])."""
        return [e for e in self.events if e.data is not None and not e.is_done and not e.is_error]

    @property
    def token_times(self) -> list[float]:
        return [e.at for e in self.tokens]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e.json()["error"] for e in self.events if e.is_error]

    @property
    def done(self) -> bool:
        return any(e.is_done for e in self.events)

    @property
    def first_token_at(self) -> float:
        return self.token_times[0]

    @property
    def last_token_at(self) -> float:
        return self.token_times[-1]

    def text(self) -> str:
        """The generated text of an OpenAI chat stream."""
        out = []
        for e in self.tokens:
            for choice in e.json().get("choices", []):
                out.append(choice.get("delta", {}).get("content") or "")
        return "".join(out)


def parse_events(buffer: bytes, at: float) -> tuple[list[SseEvent], bytes]:
    """Split complete events off ``buffer`` (stamped ``at``); return them and the incomplete rest."""
    events = []
    text = buffer.replace(b"\r\n", b"\n")
    while b"\n\n" in text:
        block, text = text.split(b"\n\n", 1)
        data: list[str] = []
        name: str | None = None
        comments: list[str] = []
        for line in block.decode("utf-8", "replace").split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif line.startswith("event:"):
                name = line[6:].strip()
        if data:
            events.append(SseEvent(at, data="\n".join(data), event=name))
        elif comments:
            events.append(SseEvent(at, comment="\n".join(comments)))
    return events, text


async def stream(
    client: httpx.AsyncClient,
    path: str,
    body: Mapping[str, Any],
    *,
    drop_after: int | None = None,
    drop_when: trio.Event | None = None,
    on_event: Callable[[SseEvent], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> StreamResult:
    """POST ``body`` (with stream: true) and collect the reply's events with their arrival times.

    ``drop_after``: close the connection once that many token events have arrived (a client that leaves);
    ``drop_when``: close it at the first chunk after that event is set.
    ``on_event`` is called as each event arrives.
    """
    sent = trio.current_time()
    async with client.stream("POST", path, json={**body, "stream": True}, headers=headers) as response:
        result = StreamResult(response.status_code, response.headers, sent)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            result.body = await response.aread()
            result.ended_at = trio.current_time()
            return result
        rest = b""
        async for chunk in response.aiter_raw():
            result.body += chunk
            events, rest = parse_events(rest + chunk, trio.current_time())
            for event in events:
                result.events.append(event)
                if on_event is not None:
                    on_event(event)
            if (drop_after is not None and len(result.tokens) >= drop_after) or (
                drop_when is not None and drop_when.is_set()
            ):
                result.dropped = True
                break
        result.ended_at = trio.current_time()
    return result


def chat_body(model: str, text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


async def post_chat(client: httpx.AsyncClient, model: str, **extra: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=chat_body(model, **extra))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of the closed intervals that share one instant."""
    points = sorted([(a, 0) for a, _ in intervals] + [(b, 1) for _, b in intervals])
    best = current = 0
    for _, kind in points:
        current += 1 if kind == 0 else -1
        best = max(best, current)
    return best


def largest_gap(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """Check the OpenAI error shape {"error": {"message", "type", "code"}} and return the inner object."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "code" in error
    if code is not None:
        assert error["code"] == code, error
    return dict(error)


@attrs.define(eq=False)
class Pending:
    """A request running in the background: set ``first_token`` at its first token, ``done`` at its end."""

    first_token: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    result: StreamResult | None = None
    response: httpx.Response | None = None
    ended_at: float | None = None

    @property
    def stream(self) -> StreamResult:
        assert self.result is not None, "the stream has not ended"
        return self.result


def start_stream(
    nursery: trio.Nursery,
    client: httpx.AsyncClient,
    body: Mapping[str, Any],
    path: str = "/v1/chat/completions",
    **options: Any,
) -> Pending:
    """Run ``stream(client, path, body, **options)`` in ``nursery``; the returned Pending fills in."""
    pending = Pending()

    def seen(event: SseEvent) -> None:
        if event.data is not None and not event.is_done and not event.is_error:
            pending.first_token.set()

    async def run() -> None:
        try:
            pending.result = await stream(client, path, body, on_event=seen, **options)
            pending.ended_at = pending.result.ended_at
        finally:
            pending.first_token.set()
            pending.done.set()

    nursery.start_soon(run)
    return pending


def start_post(
    nursery: trio.Nursery,
    client: httpx.AsyncClient,
    body: Mapping[str, Any],
    path: str = "/v1/chat/completions",
) -> Pending:
    """POST ``body`` (not streamed) in ``nursery``; the returned Pending holds the response when done."""
    pending = Pending()

    async def run() -> None:
        try:
            pending.response = await client.post(path, json=dict(body))
            pending.ended_at = trio.current_time()
        finally:
            pending.done.set()

    nursery.start_soon(run)
    return pending


def queued_for(state: State, target: str) -> int:
    """How many requests for ``target`` wait in the scheduler's queue."""
    return sum(1 for r in state.queued() if r.target == target)


def inflight_of(state: State, model: str) -> int:
    return sum(len(r.inflight) for r in state.replicas if r.model == model)
