"""A named key's own limits over time: ``requests_per_minute`` and ``tokens_per_day`` of ``[keys.NAME]``.

Both are sliding windows (the last 60 s, the last 24 h), so a key is never let through a burst at a window's
edge. A request counts against ``requests_per_minute`` when it is admitted; its prompt and completion tokens
count against ``tokens_per_day`` when its reply ends, read from the reply's usage (a request over the limit
is refused; one already admitted runs to its end). The token window is filled from the request history at
start, so a restart forgives nothing.

Every answer to an admitted request of a key with limits carries OpenAI's ``x-ratelimit-*`` headers (what
is left of each limit, and when its oldest use leaves the window). A key over one of its limits gets 429
``rate_limit_exceeded`` with ``Retry-After`` (whole seconds until the window has room again) and the same
headers; the whole router's ``queue_limit`` stays 503 and is checked first: while the queue is full,
requests go on to the scheduler, which refuses them with 503 and they count against no key. (A key's
``max_queued`` is the scheduler's to keep: it knows the queue.)
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping

import attrs

from router.config.values import KeyConfig
from router.journal.records import RequestRecord

MINUTE = 60.0
DAY = 86400.0


@attrs.frozen
class OverLimit:
    """Why a key's request is refused (the HTTP layer answers 429 ``rate_limit_exceeded``) and the headers
    of that answer: ``Retry-After`` and ``x-ratelimit-*``."""

    message: str
    headers: dict[str, str]


def duration_text(seconds: float) -> str:
    """A reset time as OpenAI writes it: ``1s``, ``6m0s``, ``2h3m4s``."""
    whole = max(1, math.ceil(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@attrs.define
class KeyUse:
    """One key's use inside its windows: admission times, and (time, tokens) of the replies that ended."""

    requests: collections.deque[float] = attrs.field(factory=collections.deque)
    tokens: collections.deque[tuple[float, int]] = attrs.field(factory=collections.deque)
    token_sum: int = 0

    def forget_before(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - MINUTE:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - DAY:
            self.token_sum -= self.tokens.popleft()[1]

    def room_for_request(self, now: float) -> float:
        """Seconds until one more request fits in the minute (the oldest one leaves it)."""
        return self.requests[0] + MINUTE - now

    def room_for_tokens(self, limit: int, now: float) -> float:
        """Seconds until the day's tokens are below ``limit`` again."""
        total = self.token_sum
        for at, count in self.tokens:
            total -= count
            if total < limit:
                return at + DAY - now
        return 0.0


class Quotas:
    """Every named key's use against its limits (only keys that have a limit are followed)."""

    def __init__(self, keys: Mapping[str, KeyConfig]) -> None:
        self.limits: dict[str, KeyConfig] = {}
        self.use: dict[str, KeyUse] = {}
        self.configure(keys)

    def configure(self, keys: Mapping[str, KeyConfig]) -> None:
        """Follow ``keys`` (at start and on every reload); a key kept keeps what it used."""
        self.limits = {
            name: key
            for name, key in keys.items()
            if key.requests_per_minute is not None or key.tokens_per_day is not None
        }
        self.use = {name: self.use.get(name, KeyUse()) for name in self.limits}

    def refusal(self, key: str, now: float) -> OverLimit | None:
        """The 429 for a request of ``key`` over one of its limits, else None (and the request counts). Its
        headers are those of every answer (``standing``), with each exceeded limit's reset at the time the
        key has room again."""
        limits = self.limits.get(key)
        if limits is None:
            return None
        use = self.use[key]
        use.forget_before(now)
        rpm, tpd = limits.requests_per_minute, limits.tokens_per_day
        waits: list[tuple[float, str]] = []
        resets: dict[str, str] = {}
        if rpm is not None and len(use.requests) >= rpm:
            wait = use.room_for_request(now)
            resets["x-ratelimit-reset-requests"] = duration_text(wait)
            waits.append((wait, f"requests_per_minute = {rpm} ({len(use.requests)} in the last minute)"))
        if tpd is not None and use.token_sum >= tpd:
            wait = use.room_for_tokens(tpd, now)
            resets["x-ratelimit-reset-tokens"] = duration_text(wait)
            waits.append((wait, f"tokens_per_day = {tpd} ({use.token_sum} in the last 24 h)"))
        if not waits:
            if rpm is not None:
                use.requests.append(now)
            return None
        headers = {**self.standing(key, now), **resets}
        wait = max(w for w, _ in waits)
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
        over = " and ".join(why for _, why in waits)
        message = (
            f"the key '{key}' is over its {over}; retry in {duration_text(wait)}, "
            f"or raise the limit in [keys.{key}]"
        )
        return OverLimit(message, headers)

    def standing(self, key: str, now: float) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for an answer to ``key`` (none for a key without limits): each
        limit, what is left of it, and when the oldest use counted against it leaves the window."""
        limits = self.limits.get(key)
        if limits is None:
            return {}
        use = self.use[key]
        use.forget_before(now)
        headers: dict[str, str] = {}
        rpm, tpd = limits.requests_per_minute, limits.tokens_per_day
        if rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, rpm - len(use.requests)))
            reset = use.room_for_request(now) if use.requests else 0.0
            headers["x-ratelimit-reset-requests"] = duration_text(reset) if reset > 0 else "0s"
        if tpd is not None:
            headers["x-ratelimit-limit-tokens"] = str(tpd)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, tpd - use.token_sum))
            reset = use.tokens[0][0] + DAY - now if use.tokens else 0.0
            headers["x-ratelimit-reset-tokens"] = duration_text(reset) if reset > 0 else "0s"
        return headers

    def spent(self, key: str, at: float, tokens: int) -> None:
        """``key``'s reply that ended at ``at`` used ``tokens``."""
        limits = self.limits.get(key)
        if limits is None or limits.tokens_per_day is None or tokens <= 0:
            return
        use = self.use[key]
        use.tokens.append((at, tokens))
        use.token_sum += tokens

    def record(self, record: RequestRecord) -> None:
        """A record listener: a finished request's tokens count against its key."""
        if record.key:
            self.spent(record.key, record.at + record.duration, tokens_of(record))

    def seed(self, rows: Iterable[tuple[str, float, int]], now: float) -> None:
        """The last day's (key, ended at, tokens) from the history, oldest first."""
        for key, at, tokens in rows:
            if at > now - DAY:
                self.spent(key, at, tokens)


def tokens_of(record: RequestRecord) -> int:
    return (record.prompt_tokens or 0) + (record.generated_tokens or 0)
