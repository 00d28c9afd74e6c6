"""Turning a child's merged stdout/stderr into lines, picking the lines that explain an exit, handing new
lines to the readers that follow them (``LineFeed``, ``Follower``), and sending followed lines as text or
as server-sent events (``log_text``, ``log_events``)."""

from __future__ import annotations

import contextlib
import math
import re
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import aclosing

import trio

# Lines that usually say why llama-server gave up, most telling first: running out of memory, then
# "failed to ...", errors and llama.cpp's refusals of a setting ("... does not divide ...", "invalid ...",
# "... not supported", "... requires ..."), and failed assertions.
_OUT_OF_MEMORY = re.compile(
    r"out of memory|\boom\b|cannot allocate|unable to allocate|failed to allocate", re.I
)
_FAILURE = re.compile(
    r"failed to|error|does not divide|\binvalid\b|not supported|unsupported|\brequires\b|\bassert|"
    r"\bunknown (?:argument|option|value|type|model|architecture)",
    re.I,
)
# A failure line that says the load went on (a warning, a fallback, a retry) did not stop it: it is never
# named as the cause, though it may still be quoted among the last lines.
_WENT_ON = re.compile(
    r"\bwarning\b|\bfall(?:ing|s)? ?back\b|\bretrying\b|\bignoring\b|\bskip(?:ping)?\b", re.I
)
# llama.cpp's log prefix (the default of recent builds, ``--log-prefix`` in older ones): an optional
# timestamp (minutes.seconds.ms.us), then the level, I, W, E or D. Where a line has one, its level decides:
# only E lines are failures.
_PREFIX = re.compile(r"^(?:\d+\.\d+\.\d+\.\d+ +)?([IWED]) +(?=\S)")
_SPACES = re.compile(r"\s+")


class LineSplitter:
    """Accumulates raw bytes and yields complete, decoded lines.

    A line longer than ``max_line`` bytes is cut and emitted in pieces, so a child that prints without
    newlines cannot grow memory without bound.
    """

    def __init__(self, max_line: int = 16384) -> None:
        self._pending = bytearray()
        self._max_line = max_line

    def feed(self, data: bytes) -> list[str]:
        self._pending += data
        lines: list[str] = []
        while True:
            cut = self._pending.find(b"\n")
            if cut < 0:
                if len(self._pending) <= self._max_line:
                    break
                cut = self._max_line
                raw = bytes(self._pending[:cut])
                del self._pending[:cut]
            else:
                raw = bytes(self._pending[:cut])
                del self._pending[: cut + 1]
            lines.append(_decode(raw))
        return lines

    def flush(self) -> list[str]:
        """Return the unterminated tail (if any) as a last line."""
        if not self._pending:
            return []
        raw = bytes(self._pending)
        self._pending.clear()
        return [_decode(raw)]


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def telling_lines(lines: Iterable[str], *, most: int = 6, tail: int = 5, cause: bool = True) -> list[str]:
    """The lines that best explain a failure, without llama.cpp's log prefix (timestamp and level) and
    with runs of blanks collapsed.

    The first is the cause: the first out-of-memory line, or else the first failure line, one that says
    "failed to", "error" or the like, or, in prefixed output, any E line (llama.cpp states why it refused a
    load once, early, and then follows it with generic lines: "failed to create context", "exiting due to
    model loading error"); a line that says the load went on (a warning, a fallback) is never the cause.
    Then, in their original order, the other out-of-memory lines and the other failure lines, those two
    kinds in that preference and the latest ones when there are more than ``most`` lines in all; a text
    already chosen is not repeated. When no line is a failure, the last ``tail`` non-blank lines.

    ``cause=False`` names no cause (for a replica that served a while, whose first error may be an old
    request's): the lines chosen are all in their original order."""
    parsed = [_parse(line) for line in lines]
    kept = [(level, text) for level, text in parsed if text]
    texts = [text for _, text in kept]
    oom: list[int] = []
    failures: list[int] = []
    for i, (level, text) in enumerate(kept):
        if level not in (None, "E"):
            continue
        if _OUT_OF_MEMORY.search(text) and not _WENT_ON.search(text):
            oom.append(i)
        elif level == "E" or _FAILURE.search(text) or _OUT_OF_MEMORY.search(text):
            failures.append(i)
    if not oom and not failures:
        return texts[-tail:]
    first = next((i for i in [*oom, *failures] if not _WENT_ON.search(texts[i])), None)
    lead = [first] if cause and first is not None else []
    seen = {texts[i] for i in lead}
    others: list[int] = []
    for group in (oom, failures):
        for i in reversed(group):
            if len(lead) + len(others) >= most:
                break
            if texts[i] not in seen:
                others.append(i)
                seen.add(texts[i])
    return [texts[i] for i in [*lead, *sorted(others)]]


def _parse(line: str) -> tuple[str | None, str]:
    """A line's log level (None: no prefix) and its text, without the prefix, blanks collapsed."""
    text = _SPACES.sub(" ", line).strip()
    prefix = _PREFIX.match(text)
    if prefix is None:
        return None, text
    return prefix.group(1), text[prefix.end() :]


def quote_lines(
    lines: Iterable[str], *, most: int = 6, tail: int = 5, width: int = 300, cause: bool = True
) -> str:
    """``telling_lines`` joined into one short string for an error message (the cause first)."""
    chosen = telling_lines(lines, most=most, tail=tail, cause=cause)
    if not chosen:
        return "(no output)"
    return " | ".join(line if len(line) <= width else line[: width - 3] + "..." for line in chosen)


# ----------------------------------------------------------------------------------------------- following

FOLLOW_BACKLOG = 2000  # lines a follower may have waiting before newer ones are skipped
NOTE = "--- "  # how the router's own lines among a replica's output begin


class Follower:
    """One reader of a :class:`LineFeed`: the lines published since it began, waiting to be taken.

    At most ``backlog`` lines wait; a line published while that many wait is dropped and counted, and the
    reader is told how many went missing at the place where they did (a line of its own), so a follower
    that cannot keep up costs bounded memory and still knows what it missed."""

    def __init__(self, backlog: int = FOLLOW_BACKLOG) -> None:
        self._lines: deque[str] = deque()
        self._backlog = max(1, backlog)
        self._skipped = 0
        self._ended = False
        self._wake = trio.Event()

    def offer(self, line: str) -> None:
        if len(self._lines) >= self._backlog:
            self._skipped += 1
        else:
            if self._skipped:
                self._lines.append(skipped_line(self._skipped))
                self._skipped = 0
            self._lines.append(line)
        self._wake.set()

    def end(self) -> None:
        self._ended = True
        self._wake.set()

    async def next_lines(self, timeout: float = math.inf) -> list[str] | None:
        """The lines waiting (waiting for one if none does, at most ``timeout`` seconds: then ``[]``); None
        once the feed has ended and every line was taken."""
        with trio.move_on_after(timeout):
            while not self._lines and not self._skipped and not self._ended:
                self._wake = trio.Event()
                await self._wake.wait()
        lines = list(self._lines)
        self._lines.clear()
        if self._skipped:
            lines.append(skipped_line(self._skipped))
            self._skipped = 0
        if not lines and self._ended:
            return None
        return lines


def skipped_line(count: int) -> str:
    return f"{NOTE}{count} line{'s' if count != 1 else ''} skipped here: this reader did not keep up"


class LineFeed:
    """Lines as they are written, handed to every follower at once; ``close`` ends them all. Used from the
    Trio thread only."""

    def __init__(self) -> None:
        self._followers: set[Follower] = set()
        self.closed = False

    @property
    def followers(self) -> int:
        """How many readers follow the feed now."""
        return len(self._followers)

    def publish(self, line: str) -> None:
        for follower in self._followers:
            follower.offer(line)

    def close(self) -> None:
        self.closed = True
        for follower in self._followers:
            follower.end()

    @contextlib.contextmanager
    def follow(self, backlog: int = FOLLOW_BACKLOG) -> Iterator[Follower]:
        """A new follower for the lines published from now on; it stops following when the block ends
        (however it ends: a reader that went away is dropped at once)."""
        follower = Follower(backlog)
        if self.closed:
            follower.end()
        self._followers.add(follower)
        try:
            yield follower
        finally:
            self._followers.discard(follower)


SSE_KEEPALIVE = 15.0  # seconds of quiet after which an event stream gets a comment (proxies drop idle ones)


async def log_text(lines: AsyncIterator[str | None]) -> AsyncIterator[bytes]:
    """A followed log as text: each line as it comes."""
    async with aclosing(lines):  # type: ignore[type-var]
        async for line in lines:
            if line is not None:
                yield (line + "\n").encode("utf-8", errors="replace")


async def log_events(lines: AsyncIterator[str | None]) -> AsyncIterator[bytes]:
    """A followed log as server-sent events: one ``data:`` event a line, a comment after each quiet spell,
    and a last event named ``end`` (an EventSource would otherwise connect again when the stream ends)."""
    async with aclosing(lines):  # type: ignore[type-var]
        async for line in lines:
            yield b": still following\n\n" if line is None else _event("message", line)
    yield _event("end", "")


def _event(name: str, data: str) -> bytes:
    text = data.replace("\r", " ")
    head = "" if name == "message" else f"event: {name}\n"
    return f"{head}data: {text}\n\n".encode("utf-8", errors="replace")
