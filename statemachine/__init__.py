"""The pure scheduler of llama-router: ``step(state, event) -> (state, commands)``.

No I/O, no clock, no randomness: time arrives as ``Tick`` events and the scheduler asks for the next one
with ``WakeAt``. See spec/scheduler.md for the rules and invariants.
"""

from .commands import (
    CancelUpstream,
    Command,
    Dispatch,
    Eviction,
    Kill,
    KillCause,
    Reject,
    Spawn,
    Stopped,
    WakeAt,
)
from .errors import IllegalEvent
from .events import (
    ClientGone,
    DispatchFailed,
    Event,
    LoadFailed,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    SettingsChanged,
    ShutdownRequested,
    Startup,
    Tick,
    UnloadRequested,
)
from .invariants import InvariantViolation, check
from .scheduler import run, step
from .settings import DeviceSpec, ModelSpec, Policy, PoolSpec, Settings
from .state import Replica, Request, State, initial_state

__all__ = [
    "CancelUpstream",
    "ClientGone",
    "Command",
    "DeviceSpec",
    "Dispatch",
    "DispatchFailed",
    "Event",
    "Eviction",
    "IllegalEvent",
    "InvariantViolation",
    "Kill",
    "KillCause",
    "LoadFailed",
    "ModelSpec",
    "Policy",
    "PoolSpec",
    "Reject",
    "Replica",
    "ReplicaExited",
    "ReplicaReady",
    "ReplicaUnresponsive",
    "Request",
    "RequestArrived",
    "RequestFinished",
    "Settings",
    "SettingsChanged",
    "ShutdownRequested",
    "Spawn",
    "Startup",
    "State",
    "Stopped",
    "Tick",
    "UnloadRequested",
    "WakeAt",
    "check",
    "initial_state",
    "run",
    "step",
]
