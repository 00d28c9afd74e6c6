"""Fewer swaps (spec §4b, INV-SWAP-BATCH, INV-SWAP-HOLD, INV-MIN-RESIDENCY).

A swap costs seconds to minutes, so a GPU that must choose between serving the waiting requests of a model
it holds and swapping another one in serves the resident's requests first, within bounds:

- batching: a request that waits for a swap claims its GPUs at its claim time (``order.claim_time``: at once
  for an interactive request, else after ``queue_head_grace`` or its class's maximum wait) or as soon as
  ``swap_batch_max`` later requests have gone past it on those GPUs, whichever comes first;
- hold: until it claims, an idle resident that was used within the hold is not evicted for it, so that a
  client that sends its next request only after its reply gets that request served by the model still
  loaded. The hold is ``swap_hold`` seconds, or by default a tenth of the load times measured for the two
  models: a hold that turns out useless costs at most a tenth of the swap it could have saved;
- residency: a model ready for less than ``min_residency`` seconds (or still loading) is not evicted, unless
  the request that needs the room has waited its class's maximum wait.
"""

from __future__ import annotations

from .order import aged
from .settings import ModelSpec
from .state import STOPPING, Request
from .work import Work

HOLD_SHARE = 0.1  # the default hold: this share of the measured load times of the two models of a swap


def batch_full(w: Work, request: Request) -> bool:
    """``request`` has let ``swap_batch_max`` later requests go past it: it claims its GPUs now."""
    limit = w.policy.swap_batch_max
    return limit is not None and w.overtaken.get(request.rid, 0) >= limit


class Batches:
    """During one pass: the requests that wait for a swap without claiming their GPUs yet, by GPU."""

    def __init__(self, w: Work) -> None:
        self.w = w
        self.counting = w.policy.swap_batch_max is not None
        self.by_gpu: dict[int, list[tuple[Request, tuple[int, ...]]]] = {}
        # The GPUs of every request that waits for a load (claiming or not): loads asked for keep off them.
        self.reserved: set[int] = set()

    def waits(self, request: Request, gpus: tuple[int, ...]) -> None:
        """``request`` waits for a swap on ``gpus`` and does not claim them yet."""
        if self.counting:
            for gpu in gpus:
                self.by_gpu.setdefault(gpu, []).append((request, gpus))

    def passed(self, gpus: tuple[int, ...], blocked: set[int]) -> None:
        """A request ranked later was dispatched to a model on ``gpus``: each waiter there counts it, and one
        that has now let ``swap_batch_max`` go past claims its GPUs at once (``blocked``)."""
        if not self.by_gpu:
            return
        counts = self.w.overtaken
        limit = self.w.policy.swap_batch_max
        assert limit is not None
        seen: set[int] = set()
        for gpu in gpus:
            for request, held in self.by_gpu.get(gpu, ()):
                if request.rid in seen:
                    continue
                seen.add(request.rid)
                counts[request.rid] = counts.get(request.rid, 0) + 1
                if counts[request.rid] >= limit:
                    blocked.update(held)  # no later dispatch reaches these GPUs: it is counted no more


def hold_until(w: Work, victims: list[str], spec: ModelSpec) -> float | None:
    """Until when the idle ``victims`` are held against a swap to ``spec`` that is not claimed yet (None:
    not held): their latest use plus the hold, for the victim used last."""
    hold = w.policy.swap_hold
    until: float | None = None
    for victim in victims:
        if victim not in w.last_used:
            continue  # never used: no client to come back
        seconds = hold
        if seconds is None:
            seconds = HOLD_SHARE * (_measured(w, victim) + _measured(w, spec.name))
        end = w.last_used[victim] + seconds
        if end > w.now and (until is None or end > until):
            until = end
    return until


def _measured(w: Work, model: str) -> float:
    """The latest load time of ``model``, 0 when none was seen."""
    return w.load_seconds[model] if model in w.load_seconds else 0.0  # noqa: SIM401 (evolver)


def young(w: Work, request: Request | None, gpu: int) -> dict[str, float | None]:
    """The residents of ``gpu`` that ``request`` may not evict yet, with when they may leave (None: still
    loading): ready for less than ``min_residency`` seconds, or loading. None are young for a request that
    has waited its class's maximum wait."""
    least = w.policy.min_residency
    out: dict[str, float | None] = {}
    if least <= 0 or (request is not None and aged(w.policy, request, w.now)):
        return out
    for replica in w.replicas.values():
        if replica.phase == STOPPING or gpu not in replica.gpus:
            continue
        if replica.ready_at is None:
            out[replica.model] = None
        elif replica.ready_at + least > w.now and out.get(replica.model, 0.0) is not None:
            out[replica.model] = max(out.get(replica.model) or 0.0, replica.ready_at + least)
    return out
