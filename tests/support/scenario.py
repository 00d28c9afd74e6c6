"""Helpers of the scheduler scenarios in tests/core: play a script of (event, expected commands) and build
the commands the scenarios expect most often."""

from __future__ import annotations

from collections.abc import Sequence

from statemachine import (
    Command,
    Event,
    Eviction,
    Kill,
    KillCause,
    ModelSpec,
    Policy,
    Reject,
    RejectCode,
    Settings,
    Spawn,
    State,
    check,
    initial_state,
    step,
)

Script = Sequence[tuple[Event, Sequence[Command]]]


def play(settings: Settings, script: Script) -> State:
    """Feed each event; the commands must equal the expected ones exactly, and every state must pass
    ``statemachine.check``."""
    state = initial_state(settings)
    for number, (event, expected) in enumerate(script):
        state, commands = step(state, event)
        check(state)
        assert list(commands) == list(expected), f"step {number}: {event}"
    return state


def spawn(
    replica: int, model: str, rid: int, target: str | None = None, gpus: tuple[int, ...] = (0,)
) -> Spawn:
    """The Spawn that request ``rid`` (for ``target``, the model itself by default) starts."""
    return Spawn(replica, model, gpus, f"request {rid} for '{target or model}'", rid)


def evict(replica: int, model: str, new: str, policy: str = "lru", gpus: tuple[int, ...] = (0,)) -> Kill:
    """The Kill that evicts ``replica`` of ``model`` to load ``new`` on ``gpus``."""
    where = ", ".join(map(str, gpus))
    reason = f"evicted ({policy}) to load '{new}' on GPU {where}"
    return Kill(replica, model, reason, KillCause.EVICTED, Eviction(new, gpus, policy))


def shutting_down(rid: int) -> Reject:
    return Reject(rid, RejectCode.SHUTTING_DOWN, "the router is shutting down; retry shortly")


def a_b(**policy: object) -> Settings:
    """Models ``a`` (two slots) and ``b``, both on GPU 0, under ``policy``."""
    return Settings(models=[ModelSpec("a", slots=2), ModelSpec("b")], policy=Policy(**policy))  # type: ignore[arg-type]
