"""The slots and the server-side queue (chosen as llama-server chooses them), the counters behind
/metrics, and the state one server process shares between its request threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.support.simserver.args import Options
from tests.support.simserver.behaviour import Behaviour
from tests.support.simserver.tokens import common_prefix


class Slot:
    __slots__ = ("busy", "cache", "id", "last_used", "n_cache", "task_id")

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.busy = False
        self.cache: list[int] = []
        self.last_used = 0.0
        self.n_cache = 0
        self.task_id = -1


class _Waiter:
    __slots__ = ("event", "id_slot", "prompt", "slot", "task_id")

    def __init__(self, prompt: list[int], id_slot: int, task_id: int) -> None:
        self.prompt = prompt
        self.id_slot = id_slot
        self.task_id = task_id
        self.event = threading.Event()
        self.slot: Slot | None = None


class SlotPool:
    """``n`` slots; requests wait in arrival order for an idle slot, chosen as llama-server does: the idle
    slot whose cached tokens share the longest prefix with the prompt, else the least recently used one."""

    SIMILARITY = 0.1

    def __init__(self, n_slots: int) -> None:
        self._lock = threading.Lock()
        self.slots = [Slot(i) for i in range(n_slots)]
        self._waiters: list[_Waiter] = []
        self._next_task = 0

    def snapshot(self) -> list[tuple[int, bool, int, int]]:
        """(id, busy, task id or -1, cached tokens) of every slot."""
        with self._lock:
            return [(s.id, s.busy, s.task_id, len(s.cache)) for s in self.slots]

    def busy_count(self) -> int:
        with self._lock:
            return sum(s.busy for s in self.slots)

    def deferred_count(self) -> int:
        with self._lock:
            return len(self._waiters)

    def acquire(self, prompt: list[int], id_slot: int, gone: Callable[[], bool]) -> Slot | None:
        """Wait for a slot; None when ``gone()`` turns true first (the client went away)."""
        with self._lock:
            self._next_task += 1
            waiter = _Waiter(prompt, id_slot, self._next_task)
            self._waiters.append(waiter)
            self._dispatch()
        while not waiter.event.wait(0.05):
            if gone():
                with self._lock:
                    if waiter.slot is None:
                        self._waiters.remove(waiter)
                        return None
                self.release(waiter.slot, waiter.slot.cache)
                return None
        return waiter.slot

    def release(self, slot: Slot, cache: list[int]) -> None:
        with self._lock:
            slot.cache = cache
            slot.busy = False
            slot.task_id = -1
            slot.last_used = time.monotonic()
            self._dispatch()

    def _dispatch(self) -> None:
        for waiter in list(self._waiters):
            idle = [s for s in self.slots if not s.busy]
            if waiter.id_slot >= 0:
                idle = [s for s in idle if s.id == waiter.id_slot]
            if not idle:
                if waiter.id_slot < 0:
                    break
                continue
            slot = self._choose(idle, waiter.prompt)
            slot.busy = True
            slot.task_id = waiter.task_id
            slot.n_cache = min(common_prefix(slot.cache, waiter.prompt), max(len(waiter.prompt) - 1, 0))
            waiter.slot = slot
            self._waiters.remove(waiter)
            waiter.event.set()

    def _choose(self, idle: list[Slot], prompt: list[int]) -> Slot:
        best = max(idle, key=lambda s: common_prefix(s.cache, prompt))
        shared = common_prefix(best.cache, prompt)
        if prompt and shared and shared / len(prompt) >= self.SIMILARITY:
            return best
        return min(idle, key=lambda s: s.last_used)


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.prompt_seconds = 0.0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        self.n_decode = 0
        self.emitted_total = 0

    def add_request(self, prompt_n: int, prompt_s: float, predicted_n: int, predicted_s: float) -> None:
        with self._lock:
            self.prompt_tokens += prompt_n
            self.prompt_seconds += prompt_s
            self.predicted_tokens += predicted_n
            self.predicted_seconds += predicted_s
            self.n_decode += predicted_n + (1 if prompt_n else 0)

    def count_token(self) -> int:
        with self._lock:
            self.emitted_total += 1
            return self.emitted_total


class ServerState:
    def __init__(self, options: Options, behaviour: Behaviour | None, port: int) -> None:
        self.options = options
        self.behaviour = behaviour or Behaviour()
        self.port = port
        self.ready = threading.Event()
        parallel = max(options.parallel, 1)
        ctx = options.ctx if options.ctx > 0 else self.behaviour.n_ctx_train
        self.n_ctx = ctx
        self.n_ctx_slot = ctx // parallel
        self.pool = SlotPool(parallel)
        self.stats = Stats()
        base = os.path.basename(options.model)
        self.model_id = options.alias or self.behaviour.name or base or "model"

    def model_for(self, body: dict[str, Any]) -> str:
        requested = body.get("model")
        return requested if isinstance(requested, str) and requested else self.model_id
