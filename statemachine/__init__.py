"""The pure scheduler of llama-router: ``step(state, event) -> (state, commands)``.

No I/O, no clock, no randomness: time arrives as ``Tick`` events and the scheduler asks for the next one
with ``WakeAt``. See spec/scheduler.md for the rules and invariants.
"""

from .classes import RequestClass
from .commands import (
    Command,
    Dispatch,
    Eviction,
    Forward,
    Kill,
    KillCause,
    Reject,
    RejectCode,
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
    LoadRequested,
    PeerFailed,
    PeerState,
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
from .queries import (
    ModelState,
    loading_for,
    model_state,
    queue_position,
    ready_replicas,
    replica_state,
    serving_models,
)
from .scheduler import run, step
from .settings import DeviceSpec, ModelSpec, PeerSpec, Policy, PoolSpec, Settings
from .state import Replica, ReplicaPhase, Request, RequestPhase, State, initial_state

__all__ = [
    "ClientGone",
    "Command",
    "DeviceSpec",
    "Dispatch",
    "DispatchFailed",
    "Event",
    "Eviction",
    "Forward",
    "IllegalEvent",
    "InvariantViolation",
    "Kill",
    "KillCause",
    "LoadFailed",
    "LoadRequested",
    "ModelSpec",
    "ModelState",
    "PeerFailed",
    "PeerSpec",
    "PeerState",
    "Policy",
    "PoolSpec",
    "Reject",
    "RejectCode",
    "Replica",
    "ReplicaExited",
    "ReplicaPhase",
    "ReplicaReady",
    "ReplicaUnresponsive",
    "Request",
    "RequestArrived",
    "RequestClass",
    "RequestFinished",
    "RequestPhase",
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
    "loading_for",
    "model_state",
    "queue_position",
    "ready_replicas",
    "replica_state",
    "run",
    "serving_models",
    "step",
]
