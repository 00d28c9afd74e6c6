"""The environment's view of the scheduler, rebuilt only from the events fed in and the commands out.

``World.apply(event, commands, state)`` replays one step as the router shell would see it: which replicas
were spawned, readied, killed and exited, which requests wait, run, finished or were turned away. While it
walks the commands it checks the trace properties of spec/scheduler.md and files every violation under its
spec id in the returned ``Findings``. It never calls into the scheduler's own helpers: the rules it checks
are written here again, from the spec.

The parts: views.py (what the environment knows and the queries over it), step_base.py (one step's record
and the bookkeeping of its event), and the checks by subject, each building on the one below it:
evictions.py, answers.py, after_step.py, command_checks.py, with causes.py for INV-CAUSE and affinity.py for
the choice among free replicas and what each remembers.
"""

from __future__ import annotations

import attrs

from statemachine import Command, Event, State

from .affinity import memory_problems
from .command_checks import CommandChecks
from .views import Findings, WorldView


@attrs.define
class World(WorldView):
    """The view, and ``apply``: account for one step and check it."""

    def apply(self, event: Event, commands: tuple[Command, ...], state: State) -> Findings:
        """Account for one step; return the violations found, keyed by spec id."""
        return _Step(self, event, commands, state).run()


class _Step(CommandChecks):
    """The checks of one step, in the order the commands came out."""

    def run(self) -> Findings:
        self.before_commands()
        for position, command in enumerate(self.commands):
            self.position = position
            self.command(command)
        self.after_commands()
        for problem in memory_problems(self.w.replicas, self.state):
            self.fail("INV-AFFINITY-MEMORY", problem)
        return dict(self.found)
