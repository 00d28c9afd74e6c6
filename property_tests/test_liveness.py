"""Liveness: from any reachable state, the environments of spec/scheduler.md make progress within bounds.

``LivenessMachine`` reaches a state with the same random rules as ``SchedulerMachine``; its teardown then
branches from that state (states are immutable, the environment's view is copied) into:

- a fair environment (every load finishes, every request finishes, every kill exits, time advances to each
  WakeAt), which must empty the queue within the LIVE-DRAIN bound;
- the same, after a jump to the claim time of the earliest waiting request, which must leave the queue within
  three rounds (LIVE-GRACE);
- a graceful shutdown under the fair environment (LIVE-STOP);
- a shutdown whose requests never finish, ended by the deadline (LIVE-DEADLINE).

A *round* delivers, for what is pending when it starts: RequestFinished for every request in flight, then
ReplicaExited for every killed replica, then ReplicaReady for every loading one; when nothing is pending it is
a Tick to the last WakeAt instead.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import strategies as st
from hypothesis.stateful import rule

from statemachine import Kill, KillCause, ShutdownRequested, Tick
from statemachine.commands import Stopped

from .profiles import machine_settings
from .test_scheduler_machine import SchedulerMachine
from .views import WAITING


def drain_bound(waiting: int, expiries: int) -> int:
    """LIVE-DRAIN: rounds a fair environment may take to empty a queue of ``waiting`` requests.

    Per request one Tick to its claim time and three rounds for a swap (drain and kill, exit and spawn, ready
    and dispatch); per ttl expiry on the way a Tick and the exit; one more round to see the queue empty.
    """
    return 4 * waiting + 2 * expiries + 1


GRACE_ROUNDS = 3
STOP_ROUNDS = 2
DEADLINE_ROUNDS = 3


class LivenessMachine(SchedulerMachine):
    # The prefix should leave work behind: no shutdown rule (the teardown branches shut down themselves)
    # and a second way to send bursts of requests.
    shutdown = None  # type: ignore[assignment]

    @rule(data=st.data(), count=st.integers(2, 6))
    def arrive_more(self, data: st.DataObject, count: int) -> None:
        self.arrive_burst(data, count)

    @contextmanager
    def branch(self) -> Iterator[None]:
        saved = (self.state, copy.deepcopy(self.world), len(self.events), len(self.commands))
        try:
            yield
        finally:
            self.state, self.world = saved[0], saved[1]
            del self.events[saved[2] :]
            del self.commands[saved[3] :]
            self.findings = {}

    def teardown(self) -> None:
        super().teardown()
        if self.state is None:
            return
        with self.branch():
            self.live_drain()
        with self.branch():
            self.live_grace()
        with self.branch():
            self.live_stop()
        with self.branch():
            self.live_deadline()

    def live_drain(self) -> None:
        """A fair environment empties the queue within drain_bound(queued) rounds."""
        # checks: LIVE-DRAIN
        waiting = len(self.w.waiting())
        start = len(self.commands)
        rounds = 0
        while self.w.waiting():
            if not self.fair_round():
                raise AssertionError(f"LIVE-DRAIN: requests wait and nothing can happen{self.replay()}")
            rounds += 1
            expiries = sum(
                1 for c in self.commands[start:] if isinstance(c, Kill) and c.cause is KillCause.IDLE_TTL
            )
            bound = drain_bound(waiting, expiries)
            if rounds > bound:
                raise AssertionError(
                    f"LIVE-DRAIN: {waiting} requests not served in {bound} fair rounds{self.replay()}"
                )

    def live_grace(self) -> None:
        """Once the earliest waiting request has waited its claim delay, it leaves within GRACE_ROUNDS."""
        # checks: LIVE-GRACE
        waiting = self.w.waiting()
        if not waiting:
            return
        first = waiting[0]
        claim = first.arrived + self.w.settings.policy.claim_after
        if claim > self.w.now:
            self.deliver(Tick(claim))
        for _ in range(GRACE_ROUNDS):
            if self.w.requests[first.rid].status != WAITING:
                return
            self.fair_round()
        if self.w.requests[first.rid].status == WAITING:
            message = f"LIVE-GRACE: request {first.rid} still waits {GRACE_ROUNDS} rounds after its claim"
            raise AssertionError(message + self.replay())

    def live_stop(self) -> None:
        """After ShutdownRequested a fair environment sees Stopped within STOP_ROUNDS rounds."""
        # checks: LIVE-STOP
        if self.w.stopped:
            return
        if not self.w.shutting_down:
            self.deliver(ShutdownRequested(self.w.now + 5.0))
        for _ in range(STOP_ROUNDS):
            if self.w.stopped:
                return
            self.fair_round()
        if not self.w.stopped:
            raise AssertionError(f"LIVE-STOP: not stopped after {STOP_ROUNDS} fair rounds{self.replay()}")

    def live_deadline(self) -> None:
        """Requests that never finish are cut off at the deadline; Stopped follows within DEADLINE_ROUNDS."""
        # checks: LIVE-DEADLINE
        if self.w.stopped:
            return
        if not self.w.shutting_down:
            self.deliver(ShutdownRequested(self.w.now + 5.0))
        for _ in range(DEADLINE_ROUNDS):
            if self.w.stopped:
                return
            self.fair_round(finish=False)
        if not self.w.stopped or not any(isinstance(c, Stopped) for c in self.commands):
            raise AssertionError(f"LIVE-DEADLINE: not stopped {DEADLINE_ROUNDS} rounds{self.replay()}")


TestLivenessMachine = LivenessMachine.TestCase
TestLivenessMachine.settings = machine_settings(share=4)
