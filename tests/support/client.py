"""What a test does as a client of the router: requests, streams with arrival times, and checks.

``stream(client, path, body)`` sends one streamed request and keeps every server-sent event with the
``trio.current_time()`` at which it arrived, so that tests can compare when tokens of different replies
arrived instead of sleeping and hoping. ``start_stream`` and ``start_post`` run a request in the background
and say when its first token came and when it ended.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import httpx
import trio

from tests.support.waiting import until

START_TIMEOUT = 15.0


async def wait_health(client: httpx.AsyncClient, timeout: float = START_TIMEOUT) -> None:
    """Wait until the server behind ``client`` answers ``/health`` with 200."""

    async def healthy() -> bool:
        return (await client.get("/health")).status_code == 200

    await until(healthy, timeout=timeout, what="/health answering 200", ignore=(httpx.TransportError,))


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


async def hold_busy(
    nursery: trio.Nursery, client: httpx.AsyncClient, path: str, body: Mapping[str, Any]
) -> None:
    """Stream ``body`` in ``nursery`` and return once its first token has arrived (or the stream ended): from
    then on it holds a slot until the stream ends or the nursery is cancelled."""
    busy = trio.Event()

    def seen(event: SseEvent) -> None:
        if event.data:
            busy.set()

    async def hold() -> None:
        try:
            await stream(client, path, body, on_event=seen)
        finally:
            busy.set()

    nursery.start_soon(hold)
    await busy.wait()


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
