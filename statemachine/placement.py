"""Where a model with ``choices`` (``gpus = "any"``) loads: spec §4d, INV-GPUS, INV-PLACE-*, INV-FOREIGN.

At each load the scheduler binds the model to one of its GPU sets and the load goes on exactly as for a model
with fixed GPUs. Among the sets that could ever hold another replica beside the pinned residents:

1. the fewest GPUs (one card whenever the model fits one beside its own replicas and the pinned models:
   never split across cards unless needed);
2. sets no earlier waiting request has claimed;
3. sets it fits on now, without evicting anything (no swap while a card with room for it sits idle);
4. with ``spread``, sets that hold the fewest of its own live replicas (one per card while cards have room);
5. where it must evict: sets whose victims may leave now, then the fewest busy or wanted victims, the fewest
   victims, and the victims idle the longest (least recently used; loaded first under ``eviction = "fifo"``),
   as a swap on fixed GPUs chooses;
6. the most free memory (budgets less what residents and other processes hold), then the fewest residents;
7. the lowest GPU ids.

The choice is a function of the state alone: the same state always chooses the same set.
"""

from __future__ import annotations

from collections import Counter

from .room import choose_victims, loadable, victim_key
from .settings import ModelSpec, Placement
from .state import STOPPING, Request
from .work import Work

Cost = tuple[bool, int, int, float]
Key = tuple[bool, bool, int | bool, bool, int, int, float, int, int, tuple[int, ...]]


def placed_load(
    w: Work,
    spec: ModelSpec,
    live: int,
    blocked: set[int],
    protected: set[str],
    request: Request | None = None,
) -> tuple[ModelSpec, int] | None:
    """The model bound to the set its next replica loads on, and how many replicas may load there (one for a
    model with choices); None when no set could ever hold one. A model with fixed GPUs is itself."""
    if not spec.chooses:
        count = loadable(w, spec, live)
        return (spec, count) if count else None
    best: tuple[Key, ModelSpec] | None = None
    for choice in _eligible(w, spec, live):
        placed = spec.placed(choice)
        key = _key(w, spec, placed, choice, blocked, protected, request)
        if best is None or key < best[0]:
            best = (key, placed)
    return None if best is None else (best[1], 1)


def _eligible(w: Work, spec: ModelSpec, live: int) -> list[Placement]:
    """The smallest sets that could ever hold one more replica beside the pinned residents."""
    size: int | None = None
    out: list[Placement] = []
    own: Counter[int] = Counter()
    for r in w.live_replicas(spec.name):
        for gpu in r.gpus:
            own[gpu] += spec.need_for(r.gpus, gpu)
    for choice in sorted(spec.choices, key=lambda c: (len(c.gpus), c.gpus)):
        if size is not None and len(choice.gpus) > size:
            break
        if loadable(w, spec.placed(choice), live, own):
            size = len(choice.gpus)
            out.append(choice)
    return out


def _here(w: Work, model: str, gpus: tuple[int, ...]) -> int:
    """Live replicas of ``model`` on any of ``gpus``."""
    return sum(not set(gpus).isdisjoint(r.gpus) for r in w.live_replicas(model))


def _key(
    w: Work,
    spec: ModelSpec,
    placed: ModelSpec,
    choice: Placement,
    blocked: set[int],
    protected: set[str],
    request: Request | None,
) -> Key:
    gpus = choice.gpus
    fits = all(w.fits(placed, g, 1, set(), count_stopping=True) for g in gpus)
    mine = spec.spread and _here(w, spec.name, gpus)  # (a model's first replica finds none of its own)
    free = sum(
        budget
        - w.foreign_on(gpu)
        - sum(w.spec_of(r).need_for(r.gpus, gpu) for r in w.replicas.values() if gpu in r.gpus)
        for gpu in gpus
        if (budget := w.settings.budget(gpu)) is not None
    )
    residents = {
        r.model for r in w.replicas.values() if r.phase != STOPPING and not set(gpus).isdisjoint(r.gpus)
    }
    cost = NO_EVICTION if fits else _eviction_cost(w, placed, protected, request)
    return (not blocked.isdisjoint(gpus), not fits, mine, *cost, -free, len(residents), gpus)


NO_EVICTION: Cost = (False, 0, 0, 0.0)
CANNOT_NOW: Cost = (True, 0, 0, 0.0)


def _eviction_cost(w: Work, placed: ModelSpec, protected: set[str], request: Request | None) -> Cost:
    """(cannot now, busy or wanted victims, victims, the latest use among them): smaller evicts less."""
    victims = choose_victims(w, request, placed, 1, protected, [])
    if victims is None:
        return CANNOT_NOW
    busy = sum(w.has_queued(v) or any(r.inflight for r in w.replicas_of(v)) for v in victims)
    latest = max((victim_key(w, v)[1] for v in victims), default=0.0)  # none: it waits for exits only
    return (False, busy, len(victims), latest)


def spawn_fitting(w: Work, spec: ModelSpec, blocked: set[int], reason: str, rid: int | None) -> None:
    """Start the missing replicas of ``spec`` that fit now, one by one, each where ``placed_load`` chooses
    (for a model with choices: spread over cards when ``spread``), until the choice would need an eviction
    or a claimed GPU; nothing is evicted for them."""
    while True:
        live = len(w.live_replicas(spec.name))
        load = placed_load(w, spec, live, blocked, set(), None)
        if load is None:
            return
        placed = load[0]
        if not blocked.isdisjoint(placed.gpus):
            return
        if not all(w.fits(placed, g, 1, set(), count_stopping=True) for g in placed.gpus):
            return
        w.spawn(placed, reason, rid)
