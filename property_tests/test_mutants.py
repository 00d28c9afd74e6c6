"""The property tests can fail: deliberately broken schedulers are caught, each by the property it breaks.

Each mutant replaces one fragment of a statemachine module's source, runs the modified module in place of the
original for the length of one test (functions are rebound; classes keep their identity and get the modified
methods), and expects ``SchedulerMachine`` to fail with the named id. When a fragment no longer occurs in the
source, the test fails and says which mutant to update.
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import initialize, run_state_machine_as_test

from statemachine import Settings

from .strategies import claim_settings, replica_choice_settings
from .test_affinity_machine import AffinityMachine
from .test_placement_machine import PlacementMachine
from .test_scheduler_machine import SchedulerMachine


class ClaimMachine(SchedulerMachine):
    """The scheduler machine on two GPUs that four models take turns on (see ``claim_settings``)."""

    @initialize(settings=claim_settings())
    def setup(self, settings: Settings) -> None:
        super().setup(settings)


class ReplicaChoiceMachine(AffinityMachine):
    """The affinity machine on one model of three replicas (see ``replica_choice_settings``)."""

    @initialize(settings=replica_choice_settings())
    def setup(self, settings: Settings) -> None:
        super().setup(settings)


# Mutants whose situation the general machines reach too seldom for a fixed search: they get a machine whose
# settings make it common.
FOCUSED: dict[str, type[SchedulerMachine]] = {
    "a request behind an earlier claim still evicts": ClaimMachine,
    "victims from other GPUs": ClaimMachine,
    "affinity ignores the guard": ReplicaChoiceMachine,
    "the first matching replica wins": ReplicaChoiceMachine,
}

# (module, original fragment, broken fragment, the ids that may catch it)
MUTANTS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "dispatch ignores held GPUs": (
        "passes",
        "replica = w.free_replica(name, prefix, blocked)",
        "replica = w.free_replica(name, prefix)",
        ("INV-ORDER",),
    ),
    "a claim holds no GPUs": (
        "passes",
        "    if claiming:\n        blocked |= gpus\n    if not victims:",
        "    if not victims:",
        ("INV-ORDER",),
    ),
    "dispatch to the busiest replica": (
        "work",
        "if load < best_load and r.phase == READY and not r.draining:",
        "if (best is None or load > len(best.inflight)) and load < slots "
        "and r.phase == READY and not r.draining:",
        ("INV-LEAST-LOADED", "INV-AFFINITY-NEUTRAL"),
    ),
    "evict busy replicas": (
        "passes",
        "                if not replica.inflight:\n                    w.kill(",
        "                if True:\n                    w.kill(",
        ("INV-KILL-IDLE", "INV-EVICT-NEED"),
    ),
    "dispatch forgets to refresh the cache": (
        "work",
        "memory=memory\n        )\n        self.touched(replica.model)",
        "memory=memory\n        )",
        ("INV-INDEX",),
    ),
    "pools try their last member first": (
        "passes",
        "    for name in names:\n        peer = w.model(name).peer\n        if peer is not None:\n"
        "            if w.peer_free(peer):\n                return name, None",
        "    for name in reversed(names):\n        peer = w.model(name).peer\n        if peer is not None:\n"
        "            if w.peer_free(peer):\n                return name, None",
        ("INV-POOL-PRIORITY",),
    ),
    "a reload keeps idle retired replicas": (
        "scheduler",
        "            w.kill(replica, gone, KillCause.RELOAD)\n",
        "            pass\n",
        # A retired replica left loading also keeps the replacement its waiters need from starting.
        ("INV-RELOAD", "INV-UNLOAD", "INV-LOAD-FITS"),
    ),
    "a reload keeps waiters of removed models": (
        "scheduler",
        "            w.reject(request, RejectCode.MODEL_NOT_FOUND, message)\n",
        "            pass\n",
        ("INV-RELOAD", "INV-UNSERVABLE"),
    ),
    "load failure keeps the waiters": (
        "scheduler",
        "        return\n    w.failing.discard(model)\n    fail_waiters(",
        "        return\n    return\n    fail_waiters(",
        ("INV-LOAD-FAILURE",),
    ),
    "WakeAt asks for the latest candidate": (
        "passes",
        "    at = min(wake) if wake else None",
        "    at = max(wake) if wake else None",
        ("INV-WAKE-EARLIEST",),
    ),
    "victims from other GPUs": (
        "room",
        "                if gpu in r.gpus and r.phase != STOPPING and r.model != spec.name",
        "                if r.phase != STOPPING and r.model != spec.name",
        ("INV-VICTIM", "INV-EVICT-NEED"),
    ),
    "a request behind an earlier claim still evicts": (
        "passes",
        "        if claiming:\n            blocked |= gpus\n        return\n",
        "        if claiming:\n            blocked |= gpus\n",
        ("INV-EVICT-NEED", "INV-VICTIM"),
    ),
    "busy victims evicted before the claim": (
        "passes",
        "    elif claiming or not busy:",
        "    elif True:",
        ("INV-EVICT-NEED", "INV-VICTIM"),
    ),
    "has_queued ignores the model's own queue": (
        "work",
        "        if model in queues and queues[model].count:\n            return True\n",
        "",
        ("INV-EVICT-NEED", "INV-VICTIM"),
    ),
    "an exact fit is refused": (
        "work",
        "return budget is None or used + self.foreign_on(gpu) <= budget",
        "return budget is None or used + self.foreign_on(gpu) < budget",
        ("INV-LOAD-FITS", "INV-EVICT-NEED"),
    ),
    "loadable flips a sign": (
        "room",
        "mine = need * live if own is None",
        "mine = -need * live if own is None",
        ("INV-WAKE-EARLIEST", "INV-UNSERVABLE", "INV-LOAD-FITS"),
    ),
    "Startup spawns every replica again": (
        "scheduler",
        "        missing = spec.replicas - live\n",
        "        missing = spec.replicas\n",
        ("INV-REPLICAS",),
    ),
    "a second, earlier shutdown deadline is ignored": (
        "scheduler",
        "min(w.deadline, e.deadline)",
        "w.deadline",
        ("INV-WAKE-EARLIEST", "INV-SHUTDOWN"),
    ),
    "load failures answered as model_unavailable": (
        "scheduler",
        "RejectCode.LOAD_FAILED)",
        "RejectCode.MODEL_UNAVAILABLE)",
        ("INV-ANSWER",),
    ),
    "drained replicas killed as if unloaded by request": (
        "passes",
        'w.kill(replica, "unloaded", KillCause.DRAINED)',
        'w.kill(replica, "unloaded", KillCause.UNLOADED)',
        ("INV-CAUSE",),
    ),
    "a spawn forgets its request": (
        "passes",
        "f\"request {request.rid} for '{request.target}'\", request.rid",
        "f\"request {request.rid} for '{request.target}'\", None",
        ("INV-CAUSE",),
    ),
    "a refused dispatch of a removed target answered model_unavailable": (
        "recovery",
        "w.reject(request, RejectCode.MODEL_NOT_FOUND, message)",
        "w.reject(request, RejectCode.MODEL_UNAVAILABLE, message)",
        ("INV-ANSWER", "INV-REDISPATCH"),
    ),
}


# The same, for the affinity choice: caught by AffinityMachine, whose arrivals carry prefix chains.
AFFINITY_MUTANTS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "affinity ignores the guard": (
        "work",
        "limit = min(best_load + self.policy.affinity_guard, slots - 1)",
        "limit = slots - 1",
        ("INV-AFFINITY-GUARD", "INV-AFFINITY-LONGEST"),
    ),
    "the first matching replica wins": (
        "work",
        "if match > chosen_match or (match == chosen_match and match and load < chosen_load):",
        "if match and not chosen_match:",
        ("INV-AFFINITY-LONGEST",),
    ),
    "a replica remembers one chain too many": (
        "work",
        "memory = remember(memory, request.prefix, bound)",
        "memory = remember(memory, request.prefix, bound + 1)",
        ("INV-AFFINITY-MEMORY",),
    ),
    "a chain does not replace the chains it extends": (
        "affinity",
        "if not (len(known) <= len(chain) and chain[: len(known)] == known)",
        "if known != chain",
        ("INV-AFFINITY-MEMORY",),
    ),
}


# The same, for placement by the scheduler: caught by PlacementMachine (mixed cards, other processes).
PLACEMENT_MUTANTS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "placement splits a model that fits one card": (
        "placement",
        "if size is not None and len(choice.gpus) > size:",
        "if size is not None and len(choice.gpus) > size + 1:",
        ("INV-PLACE-SMALLEST",),
    ),
    "placement evicts while a card has room": (
        "placement",
        "not blocked.isdisjoint(gpus), not fits, mine,",
        "not blocked.isdisjoint(gpus), False, mine,",
        ("INV-PLACE-ROOM",),
    ),
    "replicas do not spread": (
        "placement",
        "mine = spec.spread and _here(w, spec.name, gpus)",
        "mine = spec.spread and 0",
        ("INV-PLACE-SPREAD",),
    ),
    "loads ignore other processes' memory": (
        "work",
        "return budget is None or used + self.foreign_on(gpu) <= budget",
        "return budget is None or used <= budget",
        ("INV-PLACE-BUDGET",),
    ),
    "residents are evicted for other processes' memory": (
        "room",
        "if w.overcommitted(gpu):",
        "if False:",
        ("INV-FOREIGN",),
    ),
}


@contextmanager
def mutated(module_name: str, original: str, broken: str) -> Iterator[None]:
    module = importlib.import_module(f"statemachine.{module_name}")
    assert module.__file__ is not None
    with open(module.__file__) as f:
        source = f.read()
    assert original in source, f"mutant no longer applies to statemachine/{module_name}.py: {original!r}"
    saved = dict(vars(module))
    classes = {k: v for k, v in saved.items() if isinstance(v, type) and v.__module__ == module.__name__}
    methods = {cls: dict(vars(cls)) for cls in classes.values()}
    functions = {
        k: (v, v.__code__, v.__defaults__)
        for k, v in saved.items()
        if isinstance(v, types.FunctionType) and v.__module__ == module.__name__
    }
    try:
        exec(compile(source.replace(original, broken), module.__file__, "exec"), vars(module))
        # Functions keep their identity and take the modified code, so that references held elsewhere
        # (``from .passes import schedule``, the rule table of scheduler.py) run the mutant too.
        for name, (function, _, _) in functions.items():
            fresh = vars(module).get(name)
            if isinstance(fresh, types.FunctionType) and fresh is not function:
                function.__code__ = fresh.__code__
                function.__defaults__ = fresh.__defaults__
                vars(module)[name] = function
        for name, cls in classes.items():
            for attr, value in vars(vars(module)[name]).items():
                if callable(value):
                    setattr(cls, attr, value)
            vars(module)[name] = cls
        yield
    finally:
        for function, code, defaults in functions.values():
            function.__code__, function.__defaults__ = code, defaults
        for cls, attrs in methods.items():
            for attr in [a for a in vars(cls) if a not in attrs]:
                delattr(cls, attr)
            for attr, value in attrs.items():
                if callable(value):
                    setattr(cls, attr, value)
        vars(module).clear()
        vars(module).update(saved)


@pytest.mark.parametrize("name", sorted(MUTANTS) + sorted(AFFINITY_MUTANTS) + sorted(PLACEMENT_MUTANTS))
def test_a_broken_scheduler_is_caught(name: str) -> None:
    # checks: INV-ORDER INV-LEAST-LOADED INV-KILL-IDLE INV-INDEX INV-LOAD-FAILURE INV-POOL-PRIORITY INV-RELOAD
    # checks: INV-WAKE-EARLIEST INV-VICTIM INV-EVICT-NEED INV-LOAD-FITS INV-REPLICAS INV-ANSWER INV-CAUSE
    # checks: INV-AFFINITY-GUARD INV-AFFINITY-LONGEST INV-AFFINITY-MEMORY INV-FAILING
    # checks: INV-PLACE-SMALLEST INV-PLACE-ROOM INV-PLACE-SPREAD INV-PLACE-BUDGET INV-FOREIGN
    machine = SchedulerMachine if name in MUTANTS else AffinityMachine
    if name in PLACEMENT_MUTANTS:
        machine = PlacementMachine
    module_name, original, broken, ids = (MUTANTS | AFFINITY_MUTANTS | PLACEMENT_MUTANTS)[name]
    search = settings(
        max_examples=int(os.environ.get("MUTANT_EXAMPLES", "1000")),
        stateful_step_count=50,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    with mutated(module_name, original, broken), pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(FOCUSED.get(name, machine), settings=search)
    message = str(caught.value)
    assert any(i in message for i in ids), f"{name} was caught, but not by {ids}: {message[:400]}"
