"""A request's ``keep_alive`` (Ollama's field, accepted in the JSON body of every route): how long the model
that serves it stays loaded once idle, from that request on.

Accepted: a number of seconds, or a duration string as Ollama and Go write them (``"10m"``, ``"1h30m"``,
``"90s"``, ``"500ms"``, or a bare number such as ``"300"``). 0 stops the model as soon as it is idle; a
negative value keeps it loaded (no idle stop). ``[router] max_keep_alive`` bounds it (keep-for-ever included).
Anything else is answered 400 ``invalid_keep_alive``, naming the value and the forms accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from router.http.errors import HttpCode
from router.http.request_body import BodyError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_AMOUNT = r"\d+(?:\.\d*)?|\.\d+"
_UNIT = "|".join(_UNITS)
_NUMBER = re.compile(_AMOUNT)
_PART = re.compile(rf"({_AMOUNT})({_UNIT})")
_DURATION = re.compile(rf"(?:(?:{_AMOUNT})(?:{_UNIT}))+")
FORMS = 'a number of seconds or a duration such as "10m", "1h30m" or "90s" (0: unload when idle; -1: keep)'


def parse_duration(text: str) -> float | None:
    """Seconds in ``text`` (a bare number, or Go's duration syntax, optionally negative); None if neither."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if _NUMBER.fullmatch(body):
        return sign * float(body)
    if _DURATION.fullmatch(body):
        return sign * sum(float(n) * _UNITS[u] for n, u in _PART.findall(body))
    return None


def keep_alive_of(body: Mapping[str, Any], most: float | None) -> float | None:
    """The idle time ``body`` asks for (``math.inf``: keep), bounded by ``most``; None when it asks none."""
    value = body.get("keep_alive")
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = parse_duration(value)
    if seconds is None:
        shown = value if isinstance(value, str) and len(value) <= 40 else type(value).__name__
        raise BodyError(f"'keep_alive' = {shown!r} is not {FORMS}", HttpCode.INVALID_KEEP_ALIVE)
    if seconds < 0:
        seconds = math.inf
    return seconds if most is None else min(seconds, most)
