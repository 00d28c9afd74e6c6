"""Who is served first, checked against random traffic: priority classes, aging and fair share between keys.

One model, loaded at startup with one or two replicas of one or two slots, so that every waiting request
could take any free slot and the order of service is the scheduler's choice alone. Requests come from up to
four keys (weights 1–3) in the three classes, leave while they wait, finish in any order, and the clock moves
by random steps past the classes' maximum waits.

After every step, for the requests the step dispatched and those still waiting (band: 0 once a request has
waited its class's maximum wait, else 1 + its class):

- INV-CLASS: a dispatch never passes over a waiting request of a better band; within a band, a key's
  requests go in arrival order; no slot stays free while a request waits;
- INV-AGED: among aged requests (band 0), the oldest goes first, whatever its key or class;
- INV-KEY-QUEUE: a key with ``max_queued = N`` never has more than N requests waiting after a step; its
  request is refused with ``key_queue_full`` only when N of its requests waited already and it could not go
  at once, and never in place of the whole queue's ``queue_full``;
- INV-FAIR (``FairMachine``: one class, no aging): while two keys both keep requests waiting, their dispatch
  counts ``n`` follow their weights ``w``: ``|n_a / w_a - n_b / w_b| <= 2 / min(w_a, w_b)``.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statemachine import (
    ClientGone,
    Command,
    Dispatch,
    Event,
    ModelSpec,
    Policy,
    Reject,
    RejectCode,
    ReplicaReady,
    RequestArrived,
    RequestClass,
    RequestFinished,
    Settings,
    Spawn,
    Startup,
    State,
    Tick,
    check,
    initial_state,
    step,
)
from statemachine.order import rank
from statemachine.work import Work

from .arrivals import checking_arrivals
from .profiles import machine_settings

KEYS = ("", "a", "b", "c")


class ClassMachine(RuleBasedStateMachine):
    """The scheduler with classes, keys and aging, and an environment that plays replicas and clients."""

    max_wait: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __init__(self) -> None:
        super().__init__()
        self.state: State | None = None
        self.now = 0.0
        self.next_rid = 101  # unlike the seqs the scheduler gives: one is never taken for the other
        self.waiting: dict[int, tuple[str, RequestClass, float, int]] = {}  # rid -> key, class, arrived, seq
        self.running: dict[int, int] = {}  # rid -> replica
        self.slots: dict[int, int] = {}  # ready replica -> free slots
        self.seq = 0
        self.rejected: list[tuple[int, RejectCode]] = []
        self.max_queued: dict[str, int] = {}

    def build(
        self,
        replicas: int,
        slots: int,
        weights: dict[str, int],
        max_wait: tuple[float, ...],
        max_queued: dict[str, int | None] | None = None,
    ) -> None:
        model = ModelSpec("m", replicas=replicas, slots=slots, pinned=True)
        policy = Policy(max_wait=(max_wait[0], max_wait[1], max_wait[2]), queue_limit=8)
        self.max_queued = {k: n for k, n in (max_queued or {}).items() if n is not None}
        self.settings = Settings(models=[model], policy=policy, weights=weights, max_queued=self.max_queued)
        self.slot_count = slots
        self.state = initial_state(self.settings)
        self.feed(Startup())

    # ------------------------------------------------------------------------------ the environment
    def feed(self, event: Event) -> None:
        assert self.state is not None
        before = dict(self.waiting)
        self.state, commands = step(self.state, event)
        check(self.state)
        dispatched = self.carry_out(commands)
        self.after_step(before, dispatched)

    def carry_out(self, commands: tuple[Command, ...]) -> list[int]:
        dispatched = []
        for command in commands:
            match command:
                case Spawn(replica=replica):
                    self.slots[replica] = self.slot_count
                    self.state, more = step(self.state, ReplicaReady(replica))  # type: ignore[arg-type]
                    dispatched += self.carry_out(more)
                case Dispatch(rid=rid, replica=replica):
                    assert rid in self.waiting, f"request {rid} dispatched while not waiting"
                    assert self.slots[replica] > 0, f"replica {replica} has no free slot"
                    self.slots[replica] -= 1
                    self.running[rid] = replica
                    dispatched.append(rid)
                case Reject(rid=rid, code=code):
                    self.rejected.append((rid, code))
        return dispatched

    def band(self, rid: int) -> int:
        _, klass, arrived, _ = self.waiting[rid]
        return 0 if self.now >= arrived + self.max_wait[klass] else 1 + klass

    def after_step(self, before: dict[int, tuple[str, RequestClass, float, int]], went: list[int]) -> None:
        """checks: INV-CLASS INV-AGED INV-KEY-QUEUE"""
        refused = {rid for rid, _ in self.rejected}
        self.check_refusals(before, went)
        self.rejected.clear()
        before = {rid: r for rid, r in before.items() if rid not in refused}
        self.waiting = before
        bands = {rid: self.band(rid) for rid in before}
        left = [rid for rid in before if rid not in went]
        for rid in went:
            key, _, _, seq = before[rid]
            better = [r for r in left if bands[r] < bands[rid]]
            assert not better, f"INV-CLASS: {rid} (band {bands[rid]}) dispatched while {better} wait"
            same = [r for r in left if bands[r] == bands[rid] and before[r][0] == key and before[r][3] < seq]
            assert not same, f"INV-CLASS: {rid} of key {key!r} dispatched before the older {same}"
            if bands[rid] == 0:
                older = [r for r in left if bands[r] == 0 and before[r][3] < seq]
                assert not older, f"INV-AGED: {rid} dispatched before the older aged {older}"
            self.on_dispatch(rid)
        self.waiting = {rid: before[rid] for rid in left}
        if self.waiting:
            free = {r: n for r, n in self.slots.items() if n}
            assert not free, f"INV-CLASS: {len(self.waiting)} requests wait while replicas {free} have room"

    def check_refusals(
        self, before: dict[int, tuple[str, RequestClass, float, int]], went: list[int]
    ) -> None:
        """INV-KEY-QUEUE, for a step whose arrivals may have been refused (only arrivals are, here)."""
        for rid, code in self.rejected:
            assert code in (RejectCode.QUEUE_FULL, RejectCode.KEY_QUEUE_FULL), f"{rid} refused: {code}"
            key = before[rid][0]
            assert rid not in went, f"{rid} both dispatched and refused"
            others = [r for r in before if r != rid]  # what waited as it arrived
            if code is RejectCode.QUEUE_FULL:
                assert len(others) >= 8, f"INV-LIMITS: {rid} refused with {len(others)} waiting"
            else:
                mine = [r for r in others if before[r][0] == key]
                limit = self.max_queued.get(key)
                assert limit is not None and len(mine) >= limit, f"INV-KEY-QUEUE: {rid} refused, {mine} wait"
                assert len(others) < 8, "INV-KEY-QUEUE: key_queue_full where the whole queue was full"
        refused = {r for r, _ in self.rejected}
        waiting = [before[r][0] for r in before if r not in went and r not in refused]
        for key, limit in self.max_queued.items():
            assert waiting.count(key) <= limit, f"INV-KEY-QUEUE: {waiting.count(key)} of {key!r} wait"

    def on_dispatch(self, rid: int) -> None:
        """A hook for the fair-share machine."""

    # ------------------------------------------------------------------------------------- rules
    @initialize(
        replicas=st.integers(1, 2),
        slots=st.integers(1, 2),
        weights=st.fixed_dictionaries({k: st.integers(1, 3) for k in KEYS[1:]}),
        max_wait=st.tuples(*[st.sampled_from((0.0, 1.0, 3.0, 1e9))] * 3),
        max_queued=st.fixed_dictionaries({k: st.sampled_from((None, 0, 1, 3)) for k in KEYS[1:]}),
    )
    def setup(
        self,
        replicas: int,
        slots: int,
        weights: dict[str, int],
        max_wait: tuple[float, ...],
        max_queued: dict[str, int | None],
    ) -> None:
        self.max_wait = (max_wait[0], max_wait[1], max_wait[2])
        self.build(replicas, slots, weights, max_wait, max_queued)

    @rule(key=st.sampled_from(KEYS), klass=st.sampled_from(RequestClass), count=st.integers(1, 3))
    def arrive(self, key: str, klass: RequestClass, count: int) -> None:
        for _ in range(count):
            rid = self.next_rid
            self.next_rid += 1
            self.seq += 1
            self.waiting[rid] = (key, klass, self.now, self.seq)
            self.feed(RequestArrived(rid, "m", key=key, klass=klass))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.slots[self.running.pop(rid)] += 1
        self.feed(RequestFinished(rid))

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[rid]
        self.feed(ClientGone(rid))

    @rule(dt=st.sampled_from((0.5, 1.0, 2.0)))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick(self.now))

    @invariant()
    def heads_agree(self) -> None:
        """The heads index (statemachine.heads, kept across steps) names the head a full ranking names."""
        if self.state is None:
            return
        w = Work(self.state)
        for target, queue in self.state.queues.items():
            found = w.best_head(target)
            ranked = sorted((rank(w.policy, w.fair, w.requests[rid], w.now), rid) for rid in queue.heads())
            assert found is not None and (found[0], found[1].rid) == ranked[0], (
                f"the index names {found and (found[0], found[1].rid)}, a full ranking {ranked[0]}"
            )

    @invariant()
    def agrees(self) -> None:
        if self.state is not None:
            queued = {rid for rid, r in self.state.requests.items() if r.phase == "queued"}
            assert queued == set(self.waiting), (
                f"the scheduler holds {queued}, the clients wait for {self.waiting}"
            )


class FairMachine(ClassMachine):
    """checks: INV-FAIR"""

    def __init__(self) -> None:
        super().__init__()
        self.served: dict[tuple[str, str], list[int]] = {}  # (a, b) -> dispatches of a and b since both wait

    @initialize(
        replicas=st.integers(1, 2),
        slots=st.integers(1, 2),
        weights=st.fixed_dictionaries({k: st.integers(1, 3) for k in KEYS[1:]}),
    )
    def setup(self, replicas: int, slots: int, weights: dict[str, int]) -> None:  # type: ignore[override]
        self.max_wait = (1e9, 1e9, 1e9)
        self.build(replicas, slots, weights, self.max_wait)

    @rule(key=st.sampled_from(KEYS), count=st.integers(1, 4))
    def arrive(self, key: str, klass: RequestClass = RequestClass.STANDARD, count: int = 1) -> None:  # type: ignore[override]
        super().arrive(key, RequestClass.STANDARD, count)

    def backlogged(self) -> set[str]:
        return {key for key, _, _, _ in self.waiting.values()}

    def on_dispatch(self, rid: int) -> None:
        key = self.waiting[rid][0]
        for pair, counts in self.served.items():
            if key in pair:
                counts[pair.index(key)] += 1

    def after_step(self, before: dict[int, tuple[str, RequestClass, float, int]], went: list[int]) -> None:
        # A pair's window opens when both keys have requests waiting before a step.
        waiting_keys = {key for key, _, _, _ in before.values()}
        for a in waiting_keys:
            for b in waiting_keys:
                if a < b:
                    self.served.setdefault((a, b), [0, 0])
        super().after_step(before, went)
        weight = self.settings.weight
        for (a, b), (na, nb) in self.served.items():
            bound = 2 / min(weight(a), weight(b))
            gap = abs(na / weight(a) - nb / weight(b))
            assert gap <= bound + 1e-9, (
                f"INV-FAIR: {a!r} got {na}, {b!r} got {nb} (weights {weight(a)}, {weight(b)})"
            )
        # A window closes once either key has nothing waiting after the step.
        still = self.backlogged()
        self.served = {pair: c for pair, c in self.served.items() if pair[0] in still and pair[1] in still}


# Attached outside the class body, whose source seeds the derandomized searches of test_mutants.py.
ClassMachine.feed = checking_arrivals(ClassMachine.feed)  # type: ignore[method-assign]

TestClassMachine = ClassMachine.TestCase
TestClassMachine.settings = machine_settings(share=2)
TestFairMachine = FairMachine.TestCase
TestFairMachine.settings = machine_settings(share=2)
