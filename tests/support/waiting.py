"""The one polling primitive of the test suite: wait for a condition, until a deadline.

Tests wait for events, never for fixed time. Most waits have an event to wake them: a request's
``first_token`` and ``done`` (``tests.support.client.Pending``), the scheduler's state
(``RouterHandle.wait_state``, woken by every event the owner task feeds), the supervisor's reports, a
process's exit. What has no event to wake a waiter (another process's ``/status``, a file appearing, a
log line, a page in a browser, a pid going away) is polled here: ``await until(check, timeout=...)``
inside Trio, ``until_blocking(check, timeout=...)`` outside it. ``check`` is called until it returns
something truthy, which is returned; past ``timeout`` seconds the wait fails, naming ``what`` and the
last value seen.

The short pause between two calls of ``check`` is the only fixed sleep in tests/ outside the simulated
llama-server's emulated work and the mock-clock tests (where ``trio.sleep`` moves virtual time);
tests/docs/test_no_fixed_waits.py keeps it so. The pause starts at 5 ms and grows to 100 ms, so that a
condition that holds at once costs next to nothing and a long wait does not load a busy machine.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")

FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.1


class NotReached(AssertionError):
    """A condition did not hold before its deadline (outside Trio; Trio's waits raise TooSlowError)."""


def _pauses() -> Any:
    pause = FIRST_PAUSE
    while True:
        yield pause
        pause = min(pause * 1.5, LONGEST_PAUSE)


async def until(
    check: Callable[[], Awaitable[T] | T],
    *,
    timeout: float = 10.0,
    what: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` (a function or a coroutine function) until its result is truthy; return that result.

    Exceptions of the ``ignore`` types count as a falsy result (a server not listening yet). Raises
    ``trio.TooSlowError`` naming ``what`` and the last result when ``timeout`` seconds pass first; the
    deadline also bounds a ``check`` that hangs."""
    last: Any = None
    try:
        with trio.fail_after(timeout):
            for pause in _pauses():
                try:
                    value = check()
                    if inspect.isawaitable(value):
                        value = await value
                except ignore as exc:
                    last = exc
                else:
                    if value:
                        return value  # type: ignore[return-value]
                    last = value
                await trio.sleep(pause)
    except trio.TooSlowError:
        raise trio.TooSlowError(_message(check, what, timeout, last)) from None
    raise AssertionError("unreachable")  # pragma: no cover


def until_blocking(
    check: Callable[[], T],
    *,
    timeout: float = 10.0,
    what: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`until` for a test outside Trio: blocks the thread between calls of ``check``; raises
    :class:`NotReached` past ``timeout`` (a ``check`` that hangs is not interrupted)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    for pause in _pauses():
        try:
            value = check()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise NotReached(_message(check, what, timeout, last))
        time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def _message(check: Callable[..., Any], what: str | None, timeout: float, last: Any) -> str:
    name = what or getattr(check, "__qualname__", repr(check))
    return f"{name}: not reached within {timeout:g} s (last: {last!r})"[:4000]
