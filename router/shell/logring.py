"""Turning a child's merged stdout/stderr into lines, and picking the lines that explain an exit."""

from __future__ import annotations

import re
from collections.abc import Iterable

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
