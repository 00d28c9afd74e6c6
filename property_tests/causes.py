"""INV-CAUSE: the typed cause every Spawn and Kill carries fits what the environment saw.

A Spawn names the waiting request whose placement loads it (a request the model may serve), or no request
for the loads of the ``Startup`` rule (the pass after that rule may still load for waiting requests). A
Kill's cause names the situation it was made in; only an eviction carries an ``Eviction`` (its contents are
INV-VICTIM's business, in evictions.py). The checks read the world's view at the moment of the command, as
the other trace checks do.
"""

from __future__ import annotations

from statemachine import (
    ClientGone,
    Event,
    Kill,
    KillCause,
    LoadFailed,
    LoadRequested,
    ReplicaUnresponsive,
    SettingsChanged,
    Spawn,
    Startup,
    UnloadRequested,
)


def spawn_problem(c: Spawn, event: Event, waiting: dict[int, list[str]]) -> str:
    """Why ``c``'s cause is wrong, or "" when it fits; ``waiting`` maps each waiting request that may start a
    load (not an overflow) to the models that may serve it."""
    if c.request is None:
        if isinstance(event, Startup | LoadRequested):
            return ""
        return f"{c} names no request, but {event} is neither Startup nor LoadRequested"
    if c.request not in waiting:
        return f"{c} names request {c.request}, which is not waiting (or may start no load)"
    if c.model not in waiting[c.request]:
        return f"{c} loads {c.model}, which may not serve request {c.request}"
    return ""


def kill_problem(
    c: Kill,
    event: Event,
    *,
    busy: bool,
    draining: bool,
    retired: bool,
    ttl_due: bool,
    abandoned: bool,
    shutting_down: bool,
    deadline_due: bool,
) -> str:
    """Why ``c``'s cause does not fit its situation, or "" (whether a busy replica may be killed at all is
    INV-KILL-IDLE's business). ``busy``: the replica has requests in flight;
    ``draining``: an unload, a reload or a refused dispatch took it out of service; ``retired``: a reload
    removed or restarted its model; ``ttl_due``: its model's idle time ran out; ``abandoned``: a waiting
    request left and nothing else needs its load (INV-ABANDON). While shutting down the pass
    kills only for the shutdown; the rules of events (a failed load, a hung replica, an unload, a reload)
    still kill for their own causes."""
    cause = c.cause
    if (cause is KillCause.EVICTED) != (c.eviction is not None):
        return f"{c}: only an eviction, and every eviction, says what it makes room for"
    fits = {
        KillCause.LOAD_FAILED: isinstance(event, LoadFailed) and event.replica == c.replica,
        KillCause.UNRESPONSIVE: isinstance(event, ReplicaUnresponsive) and event.replica == c.replica,
        KillCause.UNLOADED: isinstance(event, UnloadRequested) and event.model in (None, c.model),
        KillCause.RELOAD: isinstance(event, SettingsChanged) and retired,
        KillCause.DRAINED: draining and not shutting_down,
        KillCause.IDLE_TTL: ttl_due and not shutting_down,
        KillCause.EVICTED: not shutting_down,
        KillCause.SHUTDOWN: shutting_down and not busy,
        KillCause.DEADLINE: shutting_down and deadline_due and busy,
        KillCause.ABANDONED: isinstance(event, ClientGone) and abandoned,
    }
    if not fits[cause]:
        state = f"busy={busy} draining={draining} retired={retired} ttl_due={ttl_due}"
        return f"{c} after {event} does not fit its situation ({state}, shutting_down={shutting_down})"
    return ""
