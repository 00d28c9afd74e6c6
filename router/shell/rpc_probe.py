"""Whether each configured rpc-server answers: a TCP connect every few seconds, closed at once.

An rpc-server serves one client at a time and a llama-server keeps its connection while its model is
loaded, so a device that a replica holds is not probed (the replica's own health probe says more, and a
probe connection would only wait in the server's backlog). A connect is all the probe does: it sends no
command, so the server sees a client that leaves straight away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable

import attrs
import trio

log = logging.getLogger("router")

PROBE_EVERY = 10.0
CONNECT_TIMEOUT = 2.0

Endpoint = tuple[str, int]


@attrs.frozen
class Reachability:
    """The last probe of one endpoint: whether the connect succeeded, when (wall-clock seconds), how long
    it took, and the error when it failed."""

    reachable: bool
    checked_at: float
    connect_ms: float | None = None
    error: str | None = None


async def probe(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> Reachability:
    """Open and close one TCP connection to ``endpoint``."""
    host, port = endpoint
    started = trio.current_time()
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
        await stream.aclose()
    except trio.TooSlowError:
        return Reachability(False, time.time(), error=f"no answer within {timeout:g} s")
    except OSError as exc:
        return Reachability(False, time.time(), error=exc.strerror or str(exc) or type(exc).__name__)
    return Reachability(True, time.time(), connect_ms=round((trio.current_time() - started) * 1000, 1))


class RpcProbe:
    """The latest :class:`Reachability` per endpoint, refreshed by :meth:`run`."""

    def __init__(self, interval: float = PROBE_EVERY, timeout: float = CONNECT_TIMEOUT) -> None:
        self.interval = interval
        self.timeout = timeout
        self.results: dict[Endpoint, Reachability] = {}

    async def probe_all(self, endpoints: Iterable[Endpoint], keep: Iterable[Endpoint] = ()) -> None:
        """Probe ``endpoints`` at once and keep the results; the last result of an endpoint in ``keep`` stays,
        those of endpoints in neither are forgotten."""
        wanted = list(dict.fromkeys(endpoints))
        found: dict[Endpoint, Reachability] = {}

        async def one(endpoint: Endpoint) -> None:
            found[endpoint] = await probe(endpoint, self.timeout)

        async with trio.open_nursery() as nursery:
            for endpoint in wanted:
                nursery.start_soon(one, endpoint)
        for endpoint, result in found.items():
            before = self.results.get(endpoint)
            if before is not None and before.reachable != result.reachable:
                state = "answers again" if result.reachable else f"does not answer: {result.error}"
                log.warning("rpc-server %s:%d %s", endpoint[0], endpoint[1], state)
        kept = {e: self.results[e] for e in keep if e in self.results}
        self.results = {**kept, **found}

    async def run(
        self,
        endpoints: Callable[[], Collection[Endpoint]],
        busy: Callable[[], Collection[Endpoint]] = tuple,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Every ``interval`` seconds, probe ``endpoints()`` except those in ``busy()`` (held by a replica;
        their last result stays). Endpoints a reload adds are probed in the next round."""
        task_status.started()
        while True:
            wanted = endpoints()
            held = set(busy())
            try:
                await self.probe_all((e for e in wanted if e not in held), keep=held)
            except Exception:  # a probe lost is no reason to stop the router
                log.exception("probing rpc-servers failed; carrying on")
            await trio.sleep(self.interval)
