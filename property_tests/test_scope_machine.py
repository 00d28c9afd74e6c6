"""A key's scope binds pools, checked against random traffic (INV-SCOPE).

A fallback pool of three models on one or two GPUs; requests for the pool leave out a random strict subset
of its members (those outside their key's scope, as the shell tells the scheduler), others ask for a member
directly. Replicas become ready at once and are stopped when told; requests finish or leave in any order.

After every step: no request is dispatched to, and no load is started for, a model outside its scope; no
request is refused but for a full queue (every one has a member in scope that can serve it).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from statemachine import (
    ClientGone,
    Command,
    Dispatch,
    Event,
    Kill,
    ModelSpec,
    Policy,
    PoolSpec,
    Reject,
    RejectCode,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    State,
    Tick,
    check,
    initial_state,
    step,
)

from .profiles import machine_settings

MEMBERS = ("m0", "m1", "m2")


class ScopeMachine(RuleBasedStateMachine):
    """checks: INV-SCOPE"""

    def __init__(self) -> None:
        super().__init__()
        self.state: State | None = None
        self.now = 0.0
        self.next_rid = 1
        self.outside: dict[int, frozenset[str]] = {}
        self.waiting: set[int] = set()
        self.running: set[int] = set()
        self.pending: list[Event] = []

    @initialize(
        gpus=st.tuples(*[st.integers(0, 1)] * 3),
        slots=st.tuples(*[st.integers(1, 2)] * 3),
        grace=st.sampled_from((0.0, 5.0)),
    )
    def setup(self, gpus: tuple[int, ...], slots: tuple[int, ...], grace: float) -> None:
        models = [ModelSpec(m, gpus=(g,), slots=n) for m, g, n in zip(MEMBERS, gpus, slots, strict=True)]
        settings = Settings(
            models=models,
            pools=[PoolSpec("p", MEMBERS, fallback=True)],
            policy=Policy(queue_head_grace=grace),
        )
        self.state = initial_state(settings)

    def feed(self, event: Event) -> None:
        self.pending.append(event)
        while self.pending:
            assert self.state is not None
            self.state, commands = step(self.state, self.pending.pop(0))
            check(self.state)
            self.carry_out(commands)

    def carry_out(self, commands: tuple[Command, ...]) -> None:
        for command in commands:
            match command:
                case Spawn(replica=replica, model=model, request=rid):
                    if rid is not None:
                        assert model not in self.outside[rid], f"INV-SCOPE: {model} loaded for {rid}"
                    self.pending.append(ReplicaReady(replica))
                case Kill(replica=replica):
                    self.pending.append(ReplicaExited(replica, "stopped"))
                case Dispatch(rid=rid, model=model):
                    assert model not in self.outside[rid], f"INV-SCOPE: {rid} dispatched to {model}"
                    self.waiting.discard(rid)
                    self.running.add(rid)
                case Reject(rid=rid, code=code, message=message):
                    # a bounded queue may be full; nothing else refuses a request with a member in scope
                    assert code is RejectCode.QUEUE_FULL, f"INV-SCOPE: {rid} refused ({code}: {message})"
                    self.waiting.discard(rid)

    @rule(data=st.data(), count=st.integers(1, 3))
    def arrive_pool(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            allowed = data.draw(st.sets(st.sampled_from(MEMBERS), min_size=1))
            outside = frozenset(MEMBERS) - allowed
            self.arrive("p", outside)

    @rule(member=st.sampled_from(MEMBERS))
    def arrive_member(self, member: str) -> None:
        self.arrive(member, frozenset())

    def arrive(self, target: str, outside: frozenset[str]) -> None:
        rid = self.next_rid
        self.next_rid += 1
        self.outside[rid] = outside
        self.waiting.add(rid)
        self.feed(RequestArrived(rid, target, outside=outside))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(rid)
        self.feed(RequestFinished(rid))

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(rid)
        self.feed(ClientGone(rid))

    @rule(dt=st.sampled_from((1.0, 10.0)))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick(self.now))


ScopeMachine.TestCase.settings = machine_settings(share=4)
TestScopeMachine = ScopeMachine.TestCase
