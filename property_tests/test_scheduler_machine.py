"""The scheduler under random interleavings of every event type, checked after every step.

``SchedulerMachine`` plays the router shell: it draws settings, then feeds ``step()`` events that are legal
in the environment's view (``World``) — arrivals for models, pools and unknown names, client disconnects,
finishes, loads that succeed or fail, kills that complete, crashes, unloads, shutdown, startup and time.
After every step the invariants below check the new state (``statemachine.check``) and the commands of the
step against the spec's trace properties. A failure prints the settings and the plain event list that
reproduces it (see property_tests/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statemachine import (
    At,
    ClientGone,
    Command,
    DispatchFailed,
    Event,
    IllegalEvent,
    LoadFailed,
    ReplicaExited,
    ReplicaReady,
    ReplicaUnresponsive,
    RequestArrived,
    RequestFinished,
    Settings,
    SettingsChanged,
    ShutdownRequested,
    Startup,
    State,
    Tick,
    UnloadRequested,
    check,
    initial_state,
    run,
    step,
)

from .arrivals import checking_arrivals
from .profiles import machine_settings
from .replay import replay_banner
from .strategies import TOKEN_CHOICES, UNKNOWN_TARGET, models, scheduler_settings
from .views import RUNNING, WAITING, Findings, ReplicaView
from .world import World

DT_CHOICES = (0.0, 0.1, 0.5, 1.0, 3.0, 10.0)


def _not_loading(replica: ReplicaView) -> bool:
    return not replica.loading


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.settings: Settings | None = None  # the initial settings; a reload changes self.w.settings
        self.added = 0
        self.state: State | None = None
        self.world: World | None = None
        self.events: list[Event] = []
        self.commands: list[Command] = []
        self.findings: Findings = {}
        self.next_rid = 1

    # ------------------------------------------------------------------------------------ plumbing
    @initialize(settings=scheduler_settings())
    def setup(self, settings: Settings) -> None:
        self.settings = settings
        self.state = initial_state(settings)
        self.world = World(settings)

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    def replay(self) -> str:
        assert self.settings is not None
        return replay_banner(self.settings, self.events)

    def feed(self, event: Event) -> tuple[Command, ...]:
        """One step, as the shell does it; the environment's view follows the commands."""
        assert self.state is not None
        self.events.append(event)
        try:
            state, commands = step(self.state, event)
        except IllegalEvent as exc:
            raise AssertionError(f"a legal event was refused: {exc}{self.replay()}") from exc
        except Exception as exc:
            raise AssertionError(f"step() raised {exc!r}{self.replay()}") from exc
        for inv, messages in self.w.apply(event, commands, state).items():
            self.findings.setdefault(inv, []).extend(messages)
        self.state = state
        self.commands.extend(commands)
        return commands

    def expect(self, *ids: str) -> None:
        """Fail on the findings filed under ``ids`` since they were last looked at (then forget them)."""
        problems = [f"{inv}: {message}" for inv in ids for message in self.findings.pop(inv, [])]
        if problems:
            raise AssertionError("\n".join(problems) + self.replay())

    def pick(self, data: st.DataObject, options: list[int]) -> int:
        return data.draw(st.sampled_from(options))

    def check_everything(self) -> None:
        """Every invariant at once (used by the environments that run outside the rules)."""
        self.inv_state()
        for name in dir(self):
            if name.startswith("inv_") and name != "inv_state":
                getattr(self, name)()

    def targets(self) -> list[str]:
        current = self.w.settings
        return [*sorted(current.models), *sorted(current.pools), UNKNOWN_TARGET]

    # --------------------------------------------------------------------------------------- rules
    @rule(dt=st.sampled_from(DT_CHOICES))
    def tick(self, dt: float) -> None:
        self.feed(Tick(self.w.now + dt))

    @precondition(
        lambda self: self.world is not None and self.w.wake is not None and self.w.wake > self.w.now
    )
    @rule()
    def tick_to_wake(self) -> None:
        assert self.w.wake is not None
        self.feed(Tick(self.w.wake))

    @rule(data=st.data(), tokens=st.sampled_from(TOKEN_CHOICES))
    def arrive(self, data: st.DataObject, tokens: int | None) -> None:
        target = data.draw(st.sampled_from(self.targets()))
        self.feed(RequestArrived(self.next_rid, target, tokens))
        self.next_rid += 1

    @rule(data=st.data(), count=st.integers(1, 4))
    def arrive_burst(self, data: st.DataObject, count: int) -> None:
        """Several requests for models and pools in a row (no time passes between them)."""
        current = self.w.settings
        names = [*sorted(current.models), *sorted(current.pools)]
        for target in data.draw(st.lists(st.sampled_from(names), min_size=count, max_size=count)):
            self.feed(RequestArrived(self.next_rid, target, None))
            self.next_rid += 1

    @precondition(lambda self: self.world is not None and bool(self.w.settings.pools))
    @rule(data=st.data(), count=st.integers(1, 3), warm=st.booleans())
    def arrive_pool(self, data: st.DataObject, count: int, warm: bool) -> None:
        """Requests for one pool; with ``warm``, first one request for each of its members."""
        pools = self.w.settings.pools
        pool = pools[data.draw(st.sampled_from(sorted(pools)))]
        targets = [*pool.members] if warm else []
        for target in [*targets, *[pool.name] * count]:
            self.feed(RequestArrived(self.next_rid, target, None))
            self.next_rid += 1

    @precondition(lambda self: self.world is not None and bool(self.w.outstanding(WAITING, RUNNING)))
    @rule(data=st.data())
    def client_gone(self, data: st.DataObject) -> None:
        self.feed(ClientGone(self.pick(data, self.w.outstanding(WAITING, RUNNING))))

    @precondition(lambda self: self.world is not None and bool(self.w.outstanding(RUNNING)))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        broken = data.draw(st.sampled_from(["", "", "", "connection reset"]), label="broken")
        self.feed(RequestFinished(self.pick(data, self.w.outstanding(RUNNING)), broken))

    @precondition(lambda self: self.world is not None and bool(self.w.replicas_where(lambda r: r.loading)))
    @rule(data=st.data())
    def ready(self, data: st.DataObject) -> None:
        self.feed(ReplicaReady(self.pick(data, self.w.replicas_where(lambda r: r.loading))))

    @precondition(lambda self: self.world is not None and bool(self.w.outstanding(RUNNING)))
    @rule(data=st.data(), situation=st.sampled_from(("plain", "plain", "shutdown", "removed", "refused")))
    def dispatch_failed(self, data: st.DataObject, situation: str) -> None:
        """The shell could not reach the replica a request went to (connection refused); sometimes first the
        router begins to shut down, or a reload removes the request's target or refuses every candidate."""
        rid = self.pick(data, self.w.outstanding(RUNNING))
        request = self.w.requests[rid]
        current = self.w.settings
        if situation == "shutdown" and len(self.events) >= 25:
            self.feed(ShutdownRequested(self.w.now + data.draw(st.sampled_from((0.0, 5.0)))))
        elif situation == "removed":
            specs = [m for m in current.models.values() if m.name != request.target]
            pools = [
                attrs.evolve(p, members=tuple(m for m in p.members if m != request.target))
                for p in current.pools.values()
                if p.name != request.target and set(p.members) - {request.target}
            ]
            if specs:
                restart = frozenset({request.target} & set(current.models))
                self.feed(SettingsChanged(attrs.evolve(current, models=specs, pools=pools), restart))
        elif situation == "refused":
            pool = current.pools.get(request.target)
            members = set(pool.members) if pool is not None else {request.target}
            specs = [
                attrs.evolve(m, refusal="placement: no longer fits") if m.name in members else m
                for m in current.models.values()
            ]
            self.feed(SettingsChanged(attrs.evolve(current, models=specs)))
        if self.w.requests[rid].status == RUNNING:
            self.feed(DispatchFailed(rid, "connection refused"))

    @precondition(lambda self: self.world is not None and bool(self.w.replicas_where(lambda r: r.loading)))
    @rule()
    def ready_all(self) -> None:
        """Every loading replica becomes ready, one event each."""
        for replica in self.w.replicas_where(lambda r: r.loading):
            if self.w.replicas[replica].loading:
                self.feed(ReplicaReady(replica))

    @precondition(lambda self: self.world is not None and bool(self.w.replicas_where(lambda r: r.loading)))
    @rule(data=st.data())
    def load_failed(self, data: st.DataObject) -> None:
        self.feed(LoadFailed(self.pick(data, self.w.replicas_where(lambda r: r.loading)), "no /health"))

    @precondition(lambda self: self.world is not None and bool(self.w.replicas_where(_not_loading)))
    @rule(data=st.data())
    def unresponsive(self, data: st.DataObject) -> None:
        """A ready replica stops answering (or a late report about one already stopping)."""
        # checks: INV-UNRESPONSIVE
        self.feed(ReplicaUnresponsive(self.pick(data, self.w.replicas_where(_not_loading)), "hung"))

    @precondition(lambda self: self.world is not None and bool(self.w.replicas_where(lambda r: r.killed)))
    @rule(data=st.data())
    def exit_after_kill(self, data: st.DataObject) -> None:
        self.feed(ReplicaExited(self.pick(data, self.w.replicas_where(lambda r: r.killed)), "killed"))

    @precondition(lambda self: self.world is not None and bool(self.w.replicas_where(lambda r: not r.killed)))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.feed(ReplicaExited(self.pick(data, self.w.replicas_where(lambda r: not r.killed)), "crashed"))

    @rule(data=st.data(), force=st.booleans())
    def unload(self, data: st.DataObject, force: bool) -> None:
        model = data.draw(st.sampled_from([None, *sorted(self.w.settings.models)]))
        self.feed(UnloadRequested(model, force))

    @precondition(lambda self: self.world is not None and not self.w.shutting_down and len(self.events) >= 25)
    @rule(delay=st.sampled_from((0.0, 1.0, 5.0)))
    def shutdown(self, delay: float) -> None:
        self.feed(ShutdownRequested(self.w.now + delay))

    @precondition(lambda self: self.world is not None and self.w.shutting_down and not self.w.stopped)
    @rule(delay=st.sampled_from((-1.0, 0.0, 1.0, 10.0)))
    def shutdown_again(self, delay: float) -> None:
        """A second shutdown request; an earlier deadline replaces the first."""
        self.feed(ShutdownRequested(self.w.now + delay))

    @rule()
    def startup(self) -> None:
        self.feed(Startup())

    @precondition(lambda self: self.world is not None)
    @rule(data=st.data(), add=st.booleans())
    def reconfigure(self, data: st.DataObject, add: bool) -> None:
        """A reload: models kept, removed, resized (restarted) or retuned (kept running); maybe one added."""
        old = self.w.settings
        specs, restart = [], set()
        for name in sorted(old.models):
            spec = old.models[name]
            change = data.draw(st.sampled_from(("keep", "keep", "remove", "resize", "retune")))
            if change == "remove":
                restart.add(name)
                continue
            if change == "resize":
                spec = attrs.evolve(spec, slots=spec.slots % 3 + 1)
                restart.add(name)
            elif change == "retune":
                spec = attrs.evolve(spec, pinned=not spec.pinned, ttl=None if spec.ttl else 2.0)
            specs.append(spec)
        if add or not specs:
            gpus = sorted(old.devices) or [0]
            self.added += 1
            specs.append(data.draw(models(100 + self.added, gpus)))
        names = {s.name for s in specs}
        pools = []
        for pool in old.pools.values():
            members = tuple(m for m in pool.members if m in names)
            if members:
                pools.append(attrs.evolve(pool, members=members))
        new = Settings(models=specs, pools=pools, devices=old.devices, policy=old.policy)
        self.feed(SettingsChanged(new, frozenset(restart)))

    @precondition(lambda self: self.world is not None)
    @rule(data=st.data())
    def illegal_event(self, data: st.DataObject) -> None:
        """Events that cannot happen now raise IllegalEvent and leave the state as it was."""
        # checks: INV-ILLEGAL
        w = self.w
        fresh = max(w.spawned_ids, default=0) + 1
        options: list[Event] = [
            Tick(w.now - 1.0),
            ReplicaReady(fresh),
            LoadFailed(fresh, "x"),
            ReplicaExited(fresh, "x"),
            RequestFinished(self.next_rid),
            ClientGone(self.next_rid),
            UnloadRequested(UNKNOWN_TARGET),
        ]
        options += [RequestFinished(rid) for rid in w.outstanding(WAITING)]
        options += [RequestArrived(rid, UNKNOWN_TARGET) for rid in w.outstanding(WAITING, RUNNING)]
        options += [DispatchFailed(rid, "x") for rid in [self.next_rid, *w.outstanding(WAITING)]]
        options += [ReplicaReady(r) for r in w.replicas_where(lambda r: r.ready)]
        options += [LoadFailed(r, "x") for r in w.replicas_where(lambda r: r.ready)]
        options += [ReplicaUnresponsive(r, "x") for r in w.replicas_where(lambda r: r.loading)]
        event = data.draw(st.sampled_from(options))
        before = repr(self.state)
        assert self.state is not None
        try:
            step(self.state, event)
        except IllegalEvent:
            pass
        else:
            raise AssertionError(f"INV-ILLEGAL: {event} was accepted{self.replay()}")
        if repr(self.state) != before:
            raise AssertionError(f"INV-ILLEGAL: {event} changed the state{self.replay()}")

    def deliver(self, event: Event) -> None:
        """One step outside the rules: feed it and run every invariant at once."""
        self.feed(event)
        self.check_everything()

    def fair_round(self, finish: bool = True) -> bool:
        """One round of the fair environment; ``finish=False``: requests never finish.

        Returns False when nothing was pending and no wake was due.
        """
        w = self.w
        running = w.outstanding(RUNNING) if finish else []
        killed = w.replicas_where(lambda r: r.killed)
        loading = w.replicas_where(lambda r: r.loading)
        for rid in running:
            if w.requests[rid].status == RUNNING:
                self.deliver(RequestFinished(rid))
        for replica in killed:
            if replica in w.replicas:
                self.deliver(ReplicaExited(replica, "killed"))
        for replica in loading:
            if replica in w.replicas and w.replicas[replica].loading:
                self.deliver(ReplicaReady(replica))
        if running or killed or loading:
            return True
        if w.wake is not None and w.wake > w.now:
            self.deliver(Tick(w.wake))
            return True
        return False

    @precondition(lambda self: self.world is not None)
    @rule()
    def catch_up(self) -> None:
        """The environment catches up: one fair round (finishes, exits, loads; else a tick to the wake)."""
        self.fair_round()

    # ---------------------------------------------------------------------------------- invariants
    @invariant()
    def inv_state(self) -> None:
        """Every state invariant of statemachine/invariants.py holds after every step."""
        # checks: INV-CAP INV-BUDGET INV-IDS INV-SLOTS INV-READY INV-KILL-IDLE INV-GPUS
        # checks: INV-REQUEST-HOME INV-QUEUE INV-SHUTDOWN INV-INDEX INV-RETIRED INV-FAILING
        if self.state is None:
            return
        try:
            check(self.state)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.replay()}") from exc

    @invariant()
    def inv_capacity(self) -> None:
        """Residency and slots, recounted from Spawn/Exited/Dispatch alone."""
        # checks: INV-CAP INV-BUDGET INV-SLOTS
        self.expect("INV-CAP", "INV-BUDGET", "INV-SLOTS")

    @invariant()
    def inv_conservation(self) -> None:
        # checks: INV-CONSERVATION
        self.expect("INV-CONSERVATION")

    @invariant()
    def inv_no_double_dispatch(self) -> None:
        # checks: INV-NO-DOUBLE-DISPATCH INV-REDISPATCH
        self.expect("INV-NO-DOUBLE-DISPATCH", "INV-REDISPATCH")

    @invariant()
    def inv_dispatch_ready(self) -> None:
        # checks: INV-DISPATCH-READY INV-LEAST-LOADED INV-BROKEN
        self.expect("INV-DISPATCH-READY", "INV-LEAST-LOADED", "INV-BROKEN")

    @invariant()
    def inv_kill_idle(self) -> None:
        # checks: INV-KILL-IDLE INV-UNLOAD
        self.expect("INV-KILL-IDLE", "INV-UNLOAD")

    @invariant()
    def inv_order(self) -> None:
        # checks: INV-ORDER
        self.expect("INV-ORDER")

    @invariant()
    def inv_pool_priority(self) -> None:
        # checks: INV-POOL-PRIORITY
        self.expect("INV-POOL-PRIORITY")

    @invariant()
    def inv_admission(self) -> None:
        # checks: INV-ADMISSION INV-LIMITS
        self.expect("INV-ADMISSION", "INV-LIMITS")

    @invariant()
    def inv_lifecycle(self) -> None:
        # checks: INV-CANCEL INV-LOAD-FAILURE INV-WAKE INV-IDS INV-GPUS INV-FAILING
        self.expect("INV-CANCEL", "INV-LOAD-FAILURE", "INV-WAKE", "INV-IDS", "INV-GPUS", "INV-FAILING")

    @invariant()
    def inv_economy(self) -> None:
        """Evictions make only the room a load needs, victims are the ones the policy names, a model that
        fits is loaded, an unservable request is answered, no model gets more replicas than it may have."""
        # checks: INV-EVICT-NEED INV-VICTIM INV-LOAD-FITS INV-UNSERVABLE INV-REPLICAS
        self.expect("INV-EVICT-NEED", "INV-VICTIM", "INV-LOAD-FITS", "INV-UNSERVABLE", "INV-REPLICAS")

    @invariant()
    def inv_answers(self) -> None:
        """Every Reject carries the status of its code and the code its situation calls for."""
        # checks: INV-ANSWER
        self.expect("INV-ANSWER")

    @invariant()
    def inv_wake(self) -> None:
        """The scheduler waits for the earliest of the deadlines the world can see."""
        # checks: INV-WAKE-EARLIEST
        self.expect("INV-WAKE-EARLIEST")

    @invariant()
    def inv_reload(self) -> None:
        # checks: INV-RELOAD
        self.expect("INV-RELOAD")

    @invariant()
    def inv_shutdown(self) -> None:
        # checks: INV-SHUTDOWN
        self.expect("INV-SHUTDOWN")

    def teardown(self) -> None:
        """Replaying the recorded events from the initial state yields the same commands and state."""
        # checks: INV-DETERMINISM
        if self.settings is None or self.state is None:
            return
        final, commands = run(initial_state(self.settings), self.events)
        if commands != self.commands or final != self.state:
            raise AssertionError(f"INV-DETERMINISM: a replay diverged{self.replay()}")


@invariant()
def _inv_causes(self: SchedulerMachine) -> None:
    """Every Spawn names the waiting request it loads for (none at Startup); every Kill's cause fits the
    situation it was made in."""
    # checks: INV-CAUSE
    self.expect("INV-CAUSE")


@invariant()
def _inv_affinity(self: SchedulerMachine) -> None:
    """A dispatch goes to the free replica within the guard that remembers the longest part of the request's
    chain (the least busy one when none does); each replica remembers what the world saw dispatched to it."""
    # checks: INV-AFFINITY-GUARD INV-AFFINITY-NEUTRAL INV-AFFINITY-LONGEST INV-AFFINITY-MEMORY
    self.expect("INV-AFFINITY-GUARD", "INV-AFFINITY-NEUTRAL", "INV-AFFINITY-LONGEST", "INV-AFFINITY-MEMORY")


@invariant()
def _inv_abandon(self: SchedulerMachine) -> None:
    """A load that nothing needs any more stops in the step its last waiting request leaves."""
    # checks: INV-ABANDON
    self.expect("INV-ABANDON")


def _feed_checking_at(feed: Callable[[SchedulerMachine, Event], tuple[Command, ...]]) -> Any:
    """``feed``, which first checks that the event, had the clock moved on before it (a little, or to the
    scheduler's wake-up), gives the same outcome as one ``At`` as after a ``Tick`` (the shell sends the
    one for the two)."""

    def checked(self: SchedulerMachine, event: Event) -> tuple[Command, ...]:
        # checks: INV-AT
        state = self.state
        if state is not None and not isinstance(event, Tick | At):
            for later in {state.now + 0.25, state.wake_at or state.now}:
                assert _outcome(state, [Tick(later), event]) == _outcome(state, [At(later, event)]), (
                    f"INV-AT: At({later}, {event!r}) differs from a Tick and the event{self.replay()}"
                )
        return feed(self, event)

    return checked


def _outcome(state: State, events: list[Event]) -> tuple[State, list[Command]] | str:
    try:
        return run(state, events)
    except IllegalEvent:
        return "illegal"


# Attached outside the class body, whose source seeds the derandomized searches of test_mutants.py: a check
# added this way leaves the examples those searches draw (and so the mutants they find) as they are.
SchedulerMachine.inv_causes = _inv_causes  # type: ignore[attr-defined]
SchedulerMachine.inv_affinity = _inv_affinity  # type: ignore[attr-defined]
SchedulerMachine.inv_abandon = _inv_abandon  # type: ignore[attr-defined]
SchedulerMachine.feed = _feed_checking_at(SchedulerMachine.feed)  # type: ignore[method-assign]
SchedulerMachine.feed = checking_arrivals(SchedulerMachine.feed)  # type: ignore[method-assign]

TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = machine_settings()
