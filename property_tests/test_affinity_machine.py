"""The scheduler machine again, now with prefix chains on every arrival and random affinity settings.

``AffinityMachine`` inherits every rule and check of ``SchedulerMachine``; it draws settings with two replicas
for most models, an affinity guard of 0–2 and a memory of 0, 1 or 4 chains per slot, and gives each arrival
a chain of up to three blocks over a two-letter alphabet, so that requests share leading blocks often and
replicas compete on their matches. The affinity checks (INV-AFFINITY-*, INV-LEAST-LOADED) run after every
step, with all the others. A separate class keeps the derandomized searches of test_mutants.py, which the
source of ``SchedulerMachine`` seeds, drawing the examples they always drew.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from statemachine import RequestArrived, Settings, initial_state

from .profiles import machine_settings
from .strategies import TOKEN_CHOICES, affinity_settings
from .test_scheduler_machine import SchedulerMachine
from .world import World

# Prefix chains over a two-letter alphabet, at most three blocks long: requests share leading blocks often.
PREFIXES = st.lists(st.sampled_from((1, 2)), max_size=3).map(tuple)


class AffinityMachine(SchedulerMachine):
    @initialize(settings=affinity_settings())
    def setup(self, settings: Settings) -> None:
        self.settings = settings
        self.state = initial_state(settings)
        self.world = World(settings)

    @rule(data=st.data(), tokens=st.sampled_from(TOKEN_CHOICES), prefix=PREFIXES)
    def arrive(self, data: st.DataObject, tokens: int | None, prefix: tuple[int, ...] = ()) -> None:
        target = data.draw(st.sampled_from(self.targets()))
        self.feed(RequestArrived(self.next_rid, target, tokens, prefix))
        self.next_rid += 1

    @rule(data=st.data(), count=st.integers(1, 4))
    def arrive_burst(self, data: st.DataObject, count: int) -> None:
        """Several requests for models and pools in a row, each with its chain."""
        current = self.w.settings
        names = [*sorted(current.models), *sorted(current.pools)]
        for target in data.draw(st.lists(st.sampled_from(names), min_size=count, max_size=count)):
            self.feed(RequestArrived(self.next_rid, target, None, data.draw(PREFIXES)))
            self.next_rid += 1

    @precondition(lambda self: self.world is not None and bool(self.w.settings.pools))
    @rule(data=st.data(), count=st.integers(1, 3), warm=st.booleans())
    def arrive_pool(self, data: st.DataObject, count: int, warm: bool) -> None:
        """Requests for one pool, each with its chain; with ``warm``, first one for each of its members."""
        pools = self.w.settings.pools
        pool = pools[data.draw(st.sampled_from(sorted(pools)))]
        targets = [*pool.members] if warm else []
        for target in [*targets, *[pool.name] * count]:
            self.feed(RequestArrived(self.next_rid, target, None, data.draw(PREFIXES)))
            self.next_rid += 1


TestAffinityMachine = AffinityMachine.TestCase
TestAffinityMachine.settings = machine_settings(share=2)
