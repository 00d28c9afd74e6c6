"""Prefix affinity, written again from spec/scheduler.md: which free replica a dispatch should have gone to
(INV-AFFINITY-GUARD, INV-AFFINITY-NEUTRAL, INV-AFFINITY-LONGEST, INV-LEAST-LOADED) and what each replica
should remember afterwards (INV-AFFINITY-MEMORY), from the dispatches the environment saw.
"""

from __future__ import annotations

from statemachine import Policy, State

from .views import ReplicaView

Chain = tuple[int, ...]


def common(a: Chain, b: Chain) -> int:
    """How many leading elements two chains share."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def match(replica: ReplicaView, chain: Chain) -> int:
    return max((common(known, chain) for known in replica.memory), default=0)


def choice_problems(
    free: list[ReplicaView], chosen: ReplicaView, chain: Chain, guard: int
) -> list[tuple[str, str]]:
    """What is wrong with dispatching a request with ``chain`` to ``chosen`` among the ``free`` replicas of
    its model (``chosen`` among them; each with a free slot)."""
    if not free:
        return []
    least = min(len(r.inflight) for r in free)
    problems = []
    if len(chosen.inflight) > least + guard:
        problems.append(
            (
                "INV-AFFINITY-GUARD",
                f"{len(chosen.inflight)} in flight on {chosen.id}, least {least}, guard {guard}",
            )
        )
    competing = [r for r in free if len(r.inflight) <= least + guard]
    top = max((match(r, chain) for r in competing), default=0)
    if top == 0:
        best = min(free, key=lambda r: (len(r.inflight), r.id))
        if best is not chosen:
            message = f"went to replica {chosen.id} while replica {best.id} was least busy (no match)"
            problems += [("INV-AFFINITY-NEUTRAL", message), ("INV-LEAST-LOADED", message)]
        return problems
    best = min((r for r in competing if match(r, chain) == top), key=lambda r: (len(r.inflight), r.id))
    if best is not chosen:
        problems.append(
            (
                "INV-AFFINITY-LONGEST",
                f"went to replica {chosen.id} (match {match(chosen, chain)}) while replica {best.id} matched "
                f"{top} blocks with {len(best.inflight)} in flight",
            )
        )
    return problems


def remember(replica: ReplicaView, chain: Chain, policy: Policy) -> None:
    """``chain`` dispatched to ``replica``: it goes in front, the chains it extends go, the bound stays."""
    if not chain:
        return
    rest = [known for known in replica.memory if common(known, chain) < len(known)]
    replica.memory = [chain, *rest][: policy.affinity_memory * replica.spec.slots]


def memory_problems(replicas: dict[int, ReplicaView], state: State) -> list[str]:
    """The scheduler's replica memories against the environment's."""
    problems = []
    for replica in state.replicas:
        mine = replicas.get(replica.id)
        if mine is not None and list(replica.memory) != mine.memory:
            problems.append(f"replica {replica.id} remembers {replica.memory}, should be {mine.memory}")
    return problems
