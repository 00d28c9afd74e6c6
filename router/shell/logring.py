"""Turning a child's merged stdout/stderr into lines, and picking the lines that explain an exit."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Lines that usually say why llama-server gave up, most telling first: running out of memory, then
# "failed to ..." and errors.
_OUT_OF_MEMORY = re.compile(
    r"out of memory|\boom\b|cannot allocate|unable to allocate|failed to allocate", re.I
)
_FAILURE = re.compile(r"failed to|error", re.I)


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


def telling_lines(lines: Iterable[str], *, most: int = 6, tail: int = 5) -> list[str]:
    """The lines that best explain a failure, in their original order: out-of-memory lines first, then
    lines saying "failed to" or "error" (the latest ones when there are more than ``most``); when no line
    says any of that, the last ``tail`` non-blank lines."""
    kept = [line.strip() for line in lines if line.strip()]
    oom = [i for i, line in enumerate(kept) if _OUT_OF_MEMORY.search(line)]
    failures = [i for i, line in enumerate(kept) if _FAILURE.search(line) and not _OUT_OF_MEMORY.search(line)]
    if not oom and not failures:
        return kept[-tail:]
    chosen = oom[-most:]
    chosen += failures[len(failures) - (most - len(chosen)) :] if len(chosen) < most else []
    return [kept[i] for i in sorted(chosen)]


def quote_lines(lines: Iterable[str], *, most: int = 6, tail: int = 5, width: int = 300) -> str:
    """``telling_lines`` joined into one short string for an error message."""
    chosen = telling_lines(lines, most=most, tail=tail)
    if not chosen:
        return "(no output)"
    return " | ".join(line if len(line) <= width else line[: width - 3] + "..." for line in chosen)
