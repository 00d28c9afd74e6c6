"""Fewer swaps, checked against random traffic: batching per model, the hold, the least residency
(INV-SWAP-BATCH, INV-SWAP-HOLD, INV-MIN-RESIDENCY, LIVE-SWAP).

Three models of one or two slots on two GPUs (one model per GPU at a time; a model on both GPUs competes with
the two others), one request class and one key, so that requests are ranked by arrival alone. Loads take as
long as the machine lets time pass before a replica is reported ready; evicted replicas exit when told. The
policy draws the claim time (``queue_head_grace``), the batch bound, the hold (fixed, none, or measured) and
the least residency.

The environment keeps its own account and checks, after every step:

- INV-SWAP-BATCH: the earliest waiting request of a model that has no live replica (it waits for a swap) has
  been passed on its GPUs by at most ``swap_batch_max`` later requests while it was so, and by none once its
  claim time had come; and a free slot of a model stays unused while a request waits for it only behind such
  a request that claims (by time or by count) a GPU of that model;
- INV-SWAP-HOLD: an idle model is evicted for a request that does not claim yet only once its hold has ended
  (its last use plus ``swap_hold``, or a tenth of the measured loads of both models);
- INV-MIN-RESIDENCY: no replica is evicted before it has been ready ``min_residency`` seconds;
- LIVE-SWAP: when arrivals stop and the environment is fair (work finishes, loads finish, killed replicas
  exit, time goes to each wake-up), every waiting request is served within a bounded number of rounds.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from statemachine import (
    ClientGone,
    Command,
    Dispatch,
    Event,
    Kill,
    KillCause,
    LoadRequested,
    ModelSpec,
    Policy,
    Reject,
    ReplicaExited,
    ReplicaReady,
    RequestArrived,
    RequestFinished,
    Settings,
    Spawn,
    State,
    Tick,
    WakeAt,
    check,
    initial_state,
    step,
)
from statemachine.swaps import HOLD_SHARE

from .profiles import machine_settings

MODELS = ("m0", "m1", "m2")
NEVER = 1e9  # the classes' maximum wait: no request ages here (aging is the class machine's)
SETTLE_ROUNDS = 40


class SwapMachine(RuleBasedStateMachine):
    """checks: INV-SWAP-BATCH INV-SWAP-HOLD INV-MIN-RESIDENCY LIVE-SWAP INV-LOAD-ASKED INV-ABANDON
    checks: INV-KEEP-ALIVE"""

    def __init__(self) -> None:
        super().__init__()
        self.state: State | None = None
        self.now = 0.0
        self.next_rid = 1
        self.waiting: dict[int, tuple[str, float]] = {}  # rid -> model, arrived (rids grow with arrival)
        self.running: dict[int, int] = {}  # rid -> replica
        self.replicas: dict[int, dict] = {}  # id -> model, spawned, ready (time or None), killed, inflight
        self.last_used: dict[str, float] = {}
        self.loads: dict[str, float] = {}  # model -> its latest measured load time
        self.passed: dict[int, int] = {}  # waiting rid -> later requests that went past it on its GPUs
        self.wake: float | None = None
        self.pending: list[Event] = []
        self.keep: dict[int, float | None] = {}  # rid -> the keep-alive it asked for
        self.keep_alive: dict[str, float] = {}  # model -> the keep-alive of its residency
        self.loaded_at: dict[str, float] = {}  # model -> when its residency began
        self.asking: set[str] = set()  # models asked for (LoadRequested) whose replicas have not started
        self.event: Event | None = None
        self.gone_model = ""

    @initialize(
        gpus=st.tuples(*[st.sampled_from(((0,), (1,), (0, 1)))] * 3),
        slots=st.tuples(*[st.integers(1, 2)] * 3),
        grace=st.sampled_from((0.0, 5.0, 30.0)),
        batch=st.sampled_from((1, 2, 4)),
        hold=st.sampled_from((0.0, 2.0, None)),
        residency=st.sampled_from((0.0, 5.0)),
    )
    def setup(
        self,
        gpus: tuple[tuple[int, ...], ...],
        slots: tuple[int, ...],
        grace: float,
        batch: int,
        hold: float | None,
        residency: float,
    ) -> None:
        models = [ModelSpec(m, gpus=g, slots=n) for m, g, n in zip(MODELS, gpus, slots, strict=True)]
        self.policy = Policy(
            queue_head_grace=grace,
            swap_batch_max=batch,
            swap_hold=hold,
            min_residency=residency,
            max_wait=(NEVER, NEVER, NEVER),
        )
        self.settings = Settings(models=models, policy=self.policy)
        self.state = initial_state(self.settings)

    # ------------------------------------------------------------------------------ the environment
    def gpus(self, model: str) -> set[int]:
        return set(self.settings.models[model].gpus)

    def live(self, model: str) -> bool:
        return any(r["model"] == model and not r["killed"] for r in self.replicas.values())

    def swap_waiters(self) -> list[tuple[int, str, float]]:
        """The earliest waiting request of each model that has no live replica: (rid, model, arrived)."""
        seen: set[str] = set()
        out = []
        for rid in sorted(self.waiting):
            model, arrived = self.waiting[rid]
            if model not in seen:
                seen.add(model)
                if not self.live(model):
                    out.append((rid, model, arrived))
        return out

    def claims(self, rid: int, arrived: float) -> bool:
        return self.now >= arrived + self.policy.claim_after or self.passed.get(rid, 0) >= (
            self.policy.swap_batch_max or 0
        )

    def hold_end(self, victim: str, model: str) -> float:
        if victim not in self.last_used:
            return float("-inf")
        hold = self.policy.swap_hold
        if hold is None:
            hold = HOLD_SHARE * (self.loads.get(victim, 0.0) + self.loads.get(model, 0.0))
        return self.last_used[victim] + hold

    def feed(self, event: Event) -> None:
        self.pending.append(event)
        while self.pending:
            assert self.state is not None
            event = self.pending.pop(0)
            self.event = event
            before = self.abandonable(event)
            waiters = self.swap_waiters()
            claiming = {rid for rid, _, arrived in waiters if self.claims(rid, arrived)}
            self.state, commands = step(self.state, event)
            check(self.state)
            self.carry_out(commands, waiters, claiming)
            self.after_step()
            left = sorted(r for r in before if not self.replicas.get(r, {"killed": True})["killed"])
            assert not left, f"INV-ABANDON: loads {left} nobody needs go on after {event}"

    def carry_out(
        self, commands: tuple[Command, ...], waiters: list[tuple[int, str, float]], claiming: set[int]
    ) -> None:
        for command in commands:
            match command:
                case Spawn(replica=replica, model=model, request=rid):
                    self.asking.discard(model)
                    self.loaded_at.setdefault(model, self.now)
                    self.replicas[replica] = {
                        "asked": rid is None,
                        "model": model,
                        "spawned": self.now,
                        "ready": None,
                        "killed": False,
                        "inflight": set(),
                    }
                case Kill(replica=replica, model=model, cause=cause, eviction=eviction):
                    if cause is KillCause.EVICTED and eviction is not None:
                        self.check_eviction(replica, model, eviction.model, waiters, claiming)
                    self.check_kill(replica, model, cause)
                    self.replicas[replica]["killed"] = True
                case Dispatch(rid=rid, replica=replica, model=model):
                    self.check_passing(rid, model, waiters, claiming)
                    del self.waiting[rid]
                    self.running[rid] = replica
                    self.replicas[replica]["inflight"].add(rid)
                    self.last_used[model] = self.now
                    if self.keep.get(rid) is not None:
                        self.keep_alive[model] = self.keep[rid]  # type: ignore[assignment]
                case Reject(rid=rid):
                    self.waiting.pop(rid, None)
                case WakeAt(at=at):
                    self.wake = at

    def abandonable(self, event: Event) -> set[int]:
        """INV-ABANDON: the loads the departure of a waiting request must stop in its step."""
        if not isinstance(event, ClientGone) or event.rid in self.waiting:
            return set()  # (the leave rule takes the request out of ``waiting`` before it feeds the event)
        model = self.gone_model
        queued = {m for m, _ in self.waiting.values()}
        replicas = {i: r for i, r in self.replicas.items() if r["model"] == model and not r["killed"]}
        if model in queued or model in self.asking or any(r["asked"] for r in replicas.values()):
            return set()
        return {i for i, r in replicas.items() if r["ready"] is None}

    def idle_due(self, model: str) -> float | None:
        """When ``model`` stops for idleness (INV-KEEP-ALIVE), None when it may not: its residency's
        keep-alive (the models here have no ttl), all its replicas ready and idle, nothing waiting for it."""
        keep = self.keep_alive.get(model)
        replicas = [r for r in self.replicas.values() if r["model"] == model and not r["killed"]]
        if keep is None or keep == math.inf or not replicas:
            return None
        if any(r["inflight"] or r["ready"] is None for r in replicas):
            return None
        if any(m == model for m, _ in self.waiting.values()):
            return None
        return max(self.loaded_at[model], self.last_used.get(model, -math.inf)) + keep

    def check_kill(self, replica: int, model: str, cause: KillCause) -> None:
        """INV-ABANDON, INV-KEEP-ALIVE: a kill for either cause fits what the environment saw."""
        if cause is KillCause.ABANDONED:
            assert isinstance(self.event, ClientGone), f"INV-ABANDON: {replica} abandoned after {self.event}"
            record = self.replicas[replica]
            assert record["ready"] is None and not record["asked"], f"INV-ABANDON: {replica} was not to stop"
            assert model not in self.asking, f"INV-ABANDON: {model} is asked for"
            assert all(m != model for m, _ in self.waiting.values()), f"INV-ABANDON: {model} is waited for"
        if cause is KillCause.IDLE_TTL:
            due = self.idle_due(model)
            assert due is not None and due <= self.now, (
                f"INV-KEEP-ALIVE: {model} stopped at {self.now}, due {due}"
            )

    def check_passing(
        self, rid: int, model: str, waiters: list[tuple[int, str, float]], claiming: set[int]
    ) -> None:
        """INV-SWAP-BATCH: a dispatch that passes a request waiting for a swap on a shared GPU."""
        for first, wanted, _ in waiters:
            if first >= rid or first not in self.waiting or not self.gpus(wanted) & self.gpus(model):
                continue
            assert first not in claiming, f"INV-SWAP-BATCH: {rid} ({model}) passed {first}, which claims"
            self.passed[first] = self.passed.get(first, 0) + 1
            bound = self.policy.swap_batch_max
            assert bound is not None and self.passed[first] <= bound, (
                f"INV-SWAP-BATCH: {self.passed[first]} requests passed {first} (swap_batch_max {bound})"
            )

    def check_eviction(
        self,
        replica: int,
        victim: str,
        model: str,
        waiters: list[tuple[int, str, float]],
        claiming: set[int],
    ) -> None:
        """INV-SWAP-HOLD and INV-MIN-RESIDENCY for one eviction Kill (making room for ``model``)."""
        ready = self.replicas[replica]["ready"]
        least = self.policy.min_residency
        if least > 0:
            assert ready is not None and ready + least <= self.now, (
                f"INV-MIN-RESIDENCY: replica {replica} of {victim} (ready at {ready}) evicted at {self.now}"
            )
        first = next((rid for rid, wanted, _ in waiters if wanted == model), None)
        if first is not None and first not in claiming and not self.replicas[replica]["inflight"]:
            end = self.hold_end(victim, model)
            assert end <= self.now, f"INV-SWAP-HOLD: {victim} evicted at {self.now}, held until {end}"

    def after_step(self) -> None:
        """INV-SWAP-BATCH: no free slot stays unused unless an earlier claim holds its GPUs. INV-KEEP-ALIVE:
        the scheduler wakes when an idle model's keep-alive runs out."""
        for model in MODELS:
            due = self.idle_due(model)
            if due is not None:
                assert due > self.now, f"INV-KEEP-ALIVE: {model} outlived its keep-alive ({due})"
                assert self.wake is not None and self.wake <= due, f"INV-KEEP-ALIVE: no wake for {due}"
        self.passed = {rid: n for rid, n in self.passed.items() if rid in self.waiting}
        held: set[int] = set()
        claims = {rid for rid, _, arrived in self.swap_waiters() if self.claims(rid, arrived)}
        waiters = {rid: model for rid, model, _ in self.swap_waiters()}
        for rid in sorted(self.waiting):
            model, _ = self.waiting[rid]
            free = any(
                r["model"] == model
                and r["ready"] is not None
                and not r["killed"]
                and len(r["inflight"]) < self.settings.models[model].slots
                for r in self.replicas.values()
            )
            assert not free or held & self.gpus(model), (
                f"INV-SWAP-BATCH: {rid} waits while {model} has a free slot and no claim holds its GPUs"
            )
            if rid in waiters and rid not in claims and not held & self.gpus(model):
                self.check_hold_wake(model)
            if rid in claims:
                held |= self.gpus(waiters[rid])

    def check_hold_wake(self, model: str) -> None:
        """INV-SWAP-HOLD: a swap put off only by the hold of idle residents is woken when the hold ends. (A
        replica stopping on its GPUs puts it off too, until its exit, whose step sets the wake anew.)"""
        stopping = any(
            r["killed"] and r["model"] != model and self.gpus(r["model"]) & self.gpus(model)
            for r in self.replicas.values()
        )
        residents = {
            r["model"]
            for r in self.replicas.values()
            if not r["killed"] and self.gpus(r["model"]) & self.gpus(model)
        } - {model}
        records = [r for r in self.replicas.values() if r["model"] in residents and not r["killed"]]
        queued = {m for m, _ in self.waiting.values()}
        if not residents or stopping or residents & queued or any(r["inflight"] for r in records):
            return
        least = self.policy.min_residency
        if least and any(r["ready"] is None or r["ready"] + least > self.now for r in records):
            return
        end = max(self.hold_end(v, model) for v in residents)
        if end > self.now:
            assert self.wake is not None and self.wake <= end, (
                f"INV-SWAP-HOLD: the hold of {sorted(residents)} ends at {end}, the scheduler wakes at "
                f"{self.wake}"
            )

    # ---------------------------------------------------------------------------------------- rules
    @rule(
        model=st.sampled_from(MODELS),
        count=st.integers(1, 3),
        keep=st.sampled_from((None, None, 0.0, 3.0, math.inf)),
    )
    def arrive(self, model: str, count: int, keep: float | None) -> None:
        for _ in range(count):
            rid = self.next_rid
            self.next_rid += 1
            self.waiting[rid] = (model, self.now)
            self.keep[rid] = keep
            self.feed(RequestArrived(rid, model, keep_alive=keep))

    @rule(model=st.sampled_from(MODELS))
    def ask(self, model: str) -> None:
        if not self.live(model):
            self.asking.add(model)
        self.feed(LoadRequested(model))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.end(rid)
        self.feed(RequestFinished(rid))

    def end(self, rid: int) -> None:
        replica = self.replicas[self.running.pop(rid)]
        replica["inflight"].discard(rid)
        self.last_used[replica["model"]] = self.now

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.waiting)))
        self.gone_model = self.waiting.pop(rid)[0]
        self.feed(ClientGone(rid))

    @precondition(lambda self: any(r["ready"] is None and not r["killed"] for r in self.replicas.values()))
    @rule(data=st.data())
    def ready(self, data: st.DataObject) -> None:
        loading = sorted(i for i, r in self.replicas.items() if r["ready"] is None and not r["killed"])
        self.make_ready(data.draw(st.sampled_from(loading)))

    def make_ready(self, replica: int) -> None:
        record = self.replicas[replica]
        record["ready"] = self.now
        self.loads[record["model"]] = self.now - record["spawned"]
        self.feed(ReplicaReady(replica))

    @precondition(lambda self: any(r["killed"] for r in self.replicas.values()))
    @rule(data=st.data())
    def exit(self, data: st.DataObject) -> None:
        self.make_exit(data.draw(st.sampled_from(sorted(i for i, r in self.replicas.items() if r["killed"]))))

    def make_exit(self, replica: int) -> None:
        record = self.replicas.pop(replica)
        if not any(r["model"] == record["model"] for r in self.replicas.values()):
            self.loaded_at.pop(record["model"], None)  # its residency ended
            self.keep_alive.pop(record["model"], None)
        for rid in sorted(record["inflight"]):
            self.running.pop(rid, None)
        self.feed(ReplicaExited(replica, "stopped"))

    @rule(dt=st.sampled_from((0.5, 1.0, 3.0, 10.0)))
    def tick(self, dt: float) -> None:
        self.advance(self.now + dt)

    def advance(self, now: float) -> None:
        self.now = now
        if self.wake is not None and self.wake <= now:
            self.wake = None
        self.feed(Tick(now))

    def replicas_loading_or_stopping(self) -> bool:
        return any(r["killed"] or r["ready"] is None for r in self.replicas.values())

    @rule()
    def settle(self) -> None:
        """With no more arrivals and a fair environment, every waiting request is served and every load asked
        for starts. checks: LIVE-SWAP INV-LOAD-ASKED"""
        assert self.state is not None
        for _ in range(SETTLE_ROUNDS):
            if not self.waiting and not self.state.wanted:
                return
            for rid in sorted(self.running):
                self.end(rid)
                self.feed(RequestFinished(rid))
            for replica in sorted(i for i, r in self.replicas.items() if r["killed"]):
                self.make_exit(replica)
            for replica in sorted(i for i, r in self.replicas.items() if r["ready"] is None):
                if replica in self.replicas and not self.replicas[replica]["killed"]:
                    self.make_ready(replica)
            if self.wake is not None:
                self.advance(max(self.wake, self.now))
            elif self.waiting and not (self.running or self.replicas_loading_or_stopping()):
                raise AssertionError(f"LIVE-SWAP: {sorted(self.waiting)} wait and nothing will wake them")
        assert not self.waiting, f"LIVE-SWAP: {sorted(self.waiting)} still wait after {SETTLE_ROUNDS} rounds"
        assert not self.state.wanted, f"INV-LOAD-ASKED: {self.state.wanted} never loaded"


SwapMachine.TestCase.settings = machine_settings(share=2)
TestSwapMachine = SwapMachine.TestCase
