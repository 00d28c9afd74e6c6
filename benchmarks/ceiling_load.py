"""The load generator of bench_ceiling.py and what it reads from /proc.

Streams are raw asyncio protocols, one connection each: the request is one prepared write, and each
``data_received`` takes one clock reading, undoes the chunked framing and counts the events whose delta has
content. No JSON is parsed, so the generator's CPU per chunk stays small beside the router's; its own CPU is
measured all the same, so that a report can say when the generator, not the router, was the limit.

CPU (user + system) and resident memory come from ``/proc/PID/stat`` and ``/proc/PID/status``; a router's
replicas are the children listed in ``/proc/PID/task/*/children``; the machine's busy share is read from
``/proc/stat``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

TICKS = os.sysconf("SC_CLK_TCK")
CONTENT = b'"content":"'  # a delta with text (the role chunk has "content":null)


# ------------------------------------------------------------------------------------------------ /proc


def cpu_seconds(pid: int) -> float | None:
    """``pid``'s user + system CPU seconds (all its threads), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a router's replicas)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return sorted(set(found))


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs together, from the first line of /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


@attrs.define
class CpuMeter:
    """CPU seconds of some processes, this process and the machine, from one reading to the next."""

    pids: Mapping[str, Sequence[int]]
    start: dict[str, float] = attrs.field(factory=dict)
    own: float = 0.0
    machine: tuple[int, int] = (0, 0)
    wall: float = 0.0

    def _read(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) or 0.0 for p in pids) for name, pids in self.pids.items()}

    def begin(self) -> None:
        self.start = self._read()
        self.own = time.process_time()
        self.machine = machine_ticks()
        self.wall = time.perf_counter()

    def end(self) -> dict[str, float]:
        """CPU seconds since :meth:`begin` per name, ``generator`` (this process), ``wall`` and ``busy``
        (the machine's busy share, 0..1, of all its CPUs)."""
        now = self._read()
        out = {name: now[name] - self.start.get(name, 0.0) for name in now}
        out["generator"] = time.process_time() - self.own
        busy, total = machine_ticks()
        out["busy"] = (busy - self.machine[0]) / max(total - self.machine[1], 1)
        out["wall"] = time.perf_counter() - self.wall
        return out


# -------------------------------------------------------------------------------------------- streaming


@attrs.define
class StreamRecord:
    """One stream: its status, when it was sent, when each content chunk came, and how it ended."""

    sent: float = 0.0
    status: int | None = None
    times: list[float] = attrs.field(factory=list)
    error: str | None = None
    done: bool = False


class StreamClient(asyncio.Protocol):
    """Sends one prepared request and times the content chunks of its (chunked) event stream."""

    def __init__(self, request: bytes, record: StreamRecord, finished: asyncio.Future[None]) -> None:
        self.request = request
        self.record = record
        self.finished = finished
        self.head = b""
        self.reading_head = True
        self.chunked = False
        self.length = -1  # bytes of a body with a Content-Length still to come (-1: none given)
        self.raw = b""
        self.left = 0  # bytes of the current HTTP chunk still to come
        self.crlf = 0  # bytes of the CRLF after it still to come
        self.events = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.record.sent = time.perf_counter()
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.reading_head:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4 :]
            self.reading_head = False
            self.record.status = int(head.split(b" ", 2)[1])
            lower = head.lower()
            self.chunked = b"transfer-encoding: chunked" in lower
            if not self.chunked and b"content-length:" in lower:
                self.length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        if self.chunked:
            self._dechunk(data, now)
        else:
            self._feed(data, now)
            self.length -= len(data)
            if self.length == 0:
                self._feed(b"\n\n", now)
                self._end(None)

    def _dechunk(self, data: bytes, now: float) -> None:
        raw = self.raw + data if self.raw else data
        at = 0
        while at < len(raw):
            if self.left == 0 and self.crlf == 0:
                line_end = raw.find(b"\r\n", at)
                if line_end < 0:
                    break
                size = int(raw[at:line_end].split(b";", 1)[0], 16)
                at = line_end + 2
                if size == 0:
                    self._end(None)
                    return
                self.left, self.crlf = size, 2
            if self.left:
                take = raw[at : at + self.left]
                at += len(take)
                self.left -= len(take)
                self._feed(take, now)
            if self.left == 0 and self.crlf:
                skip = min(self.crlf, len(raw) - at)
                at += skip
                self.crlf -= skip
        self.raw = raw[at:]

    def _feed(self, data: bytes, now: float) -> None:
        events = (self.events + data).split(b"\n\n")
        self.events = events.pop()
        for event in events:
            if CONTENT in event:
                self.record.times.append(now)
            elif self.record.status != 200:
                self.record.error = event[:300].decode(errors="replace")

    def _end(self, error: str | None) -> None:
        if self.record.done:
            return
        self.record.done = True
        if error is not None:
            self.record.error = error
        elif self.record.status != 200 and self.record.error is None:
            self.record.error = (self.events or self.raw)[:300].decode(errors="replace")
        if self.transport is not None:
            self.transport.close()
        if not self.finished.done():
            self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.record.done:
            if not self.chunked and not self.reading_head and self.record.status == 200:
                self._feed(b"\n\n", time.perf_counter())
                self._end(None)
            else:
                self._end(f"connection lost: {exc!r}")


def chat_request(host: str, port: int, body: Mapping[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


async def run_streams(
    host: str, port: int, body: Mapping[str, Any], count: int, spread: float, timeout: float
) -> list[StreamRecord]:
    """``count`` streams of ``body``, started evenly over ``spread`` seconds (0: all at once); returns once
    every one has ended or ``timeout`` seconds have passed (the late ones are recorded as timed out)."""
    loop = asyncio.get_running_loop()
    request = chat_request(host, port, body)
    records = [StreamRecord() for _ in range(count)]
    finished = [loop.create_future() for _ in range(count)]
    transports: list[asyncio.BaseTransport] = []

    async def one(index: int) -> None:
        await asyncio.sleep(spread * index / count if spread > 0 else 0.0)
        record = records[index]
        try:
            await loop.create_connection(lambda: StreamClient(request, record, finished[index]), host, port)
        except OSError as exc:
            record.error = f"connect: {exc!r}"
            record.done = True
            finished[index].set_result(None)

    starters = [asyncio.ensure_future(one(i)) for i in range(count)]
    _, pending = await asyncio.wait(finished, timeout=timeout)
    for index, future in enumerate(finished):
        if future in pending:
            records[index].error = records[index].error or f"not finished within {timeout:g} s"
    for task in starters:
        task.cancel()
    for transport in transports:
        transport.close()
    return records


async def peak_rss(pid: int | None, stop: asyncio.Event, every: float = 0.2) -> int:
    """The largest RSS of ``pid`` seen every ``every`` seconds until ``stop`` is set."""
    peak = 0
    while pid is not None:
        peak = max(peak, rss_bytes(pid) or 0)
        try:
            await asyncio.wait_for(stop.wait(), every)
            return max(peak, rss_bytes(pid) or 0)
        except TimeoutError:
            continue
    await stop.wait()
    return peak
