"""Saving a replica's slots before it stops and restoring a saved state into a new replica.

Both talk to llama-server's slot endpoints (the replica runs with ``--slot-save-path`` set to its shelf in
the :class:`~router.shell.kv_store.KvStore`): ``GET /slots`` says which slots hold anything, ``POST
/slots/{id}?action=save`` writes one to a file, ``POST /slots/{id}?action=restore`` reads one back. The caller
bounds each call in time (``kv_store_timeout``); whatever does not finish is abandoned and the model simply
starts cold next time. Nothing here raises: every outcome is a :class:`KvOutcome` to log and count.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from router.shell.kv_store import KvStore
from router.shell.prompts import PromptProbe, call_json, prompt_tokens
from statemachine import KillCause

__all__ = [
    "MIN_SHARED_TOKENS",
    "SAVE_CAUSES",
    "KvOutcome",
    "describe_kv",
    "restore_into",
    "restore_others",
    "save_slots",
]

# A restored state must share at least this many tokens with the prompt that loads the model: a chat
# template's first few tokens are the same for every conversation and not worth reading a file for.
MIN_SHARED_TOKENS = 32


class KvAction(enum.StrEnum):
    SAVE = "save"
    RESTORE = "restore"


class KvResult(enum.StrEnum):
    SAVED = "saved"  # a save kept the slots' states
    RESTORED = "restored"  # a restore put a state into a slot
    EMPTY = "empty"  # nothing to save, or no state of this model to restore
    NO_MATCH = "no_match"  # states on the shelf, none sharing enough with the prompt
    FAILED = "failed"
    TIMEOUT = "timeout"


@attrs.frozen
class KvOutcome:
    """What a save or restore did. ``outcome``: for a save ``saved``, ``empty`` (nothing to keep),
    ``failed`` or ``timeout``; for a restore ``restored``, ``no_match`` (states on the shelf, none sharing
    enough with the prompt), ``empty`` (no state for this model), ``failed`` or ``timeout``."""

    action: KvAction
    outcome: KvResult
    tokens: int = 0  # tokens saved or restored (for a restore: shared with the prompt, when known)
    nbytes: int = 0
    seconds: float = 0.0
    detail: str = ""
    slot: int = 0  # for a restore: the slot it went into (0: the one for the request that loads the model)


# Stops before which a replica's slots are saved: the replica is idle and healthy, and its model may return.
SAVE_CAUSES = frozenset(
    {
        KillCause.EVICTED,
        KillCause.IDLE_TTL,
        KillCause.UNLOADED,
        KillCause.DRAINED,
        KillCause.RELOAD,
        KillCause.SHUTDOWN,
    }
)


def describe_kv(result: KvOutcome) -> str:
    """A save or restore in words, for the log and /status."""
    what = {
        KvResult.SAVED: f"saved {result.tokens} tokens of prompt cache ({result.nbytes >> 20} MiB)",
        KvResult.RESTORED: f"restored a prompt cache sharing {result.tokens} tokens with the request"
        if result.slot == 0
        else f"restored a saved prompt cache of {result.tokens} tokens into slot {result.slot}",
        KvResult.EMPTY: "no slot held anything to save"
        if result.action is KvAction.SAVE
        else "no saved prompt cache",
        KvResult.NO_MATCH: "no saved prompt cache shares enough with the request",
        KvResult.FAILED: f"{result.action} of the prompt cache failed",
        KvResult.TIMEOUT: f"{result.action} of the prompt cache took too long",
    }[result.outcome]
    failed = result.outcome in (KvResult.FAILED, KvResult.TIMEOUT)
    detail = f": {result.detail}" if result.detail and failed else ""
    return f"{what} in {result.seconds:.2f} s{detail}"


def _used_slots(slots: Any) -> list[int]:
    """Ids of the idle slots that have served something (a slot never used has no task)."""
    used = []
    for slot in slots if isinstance(slots, list) else []:
        if not isinstance(slot, dict) or slot.get("is_processing"):
            continue
        served = slot.get("id_task") is not None or slot.get("n_prompt_tokens")
        if isinstance(slot.get("id"), int) and served:
            used.append(slot["id"])
    return used


async def save_slots(
    http: httpx.AsyncBaseTransport, port: int, store: KvStore, shelf: Path, replica: int, timeout: float
) -> KvOutcome:
    """Save every used idle slot of the replica on ``port`` to ``shelf``, within ``timeout`` seconds."""
    base = f"http://127.0.0.1:{port}"
    started = trio.current_time()
    tokens = nbytes = 0
    saved = 0
    with trio.move_on_after(timeout) as scope:
        try:
            slots = _used_slots(await call_json(http, "GET", f"{base}/slots", None))
            for slot in slots:
                name = store.new_name(replica, slot)
                reply = await call_json(
                    http, "POST", f"{base}/slots/{slot}?action=save", {"filename": f"{name}.bin"}
                )
                n_saved = reply.get("n_saved") if isinstance(reply, dict) else None
                kept = await trio.to_thread.run_sync(
                    store.keep, shelf, name, n_saved if isinstance(n_saved, int) else 0
                )
                if kept is not None:
                    saved += 1
                    tokens += len(kept)
                    nbytes += int(reply.get("n_written") or 0)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            return KvOutcome(
                KvAction.SAVE, KvResult.FAILED, tokens, nbytes, trio.current_time() - started, str(exc)
            )
    seconds = trio.current_time() - started
    if scope.cancelled_caught:
        return KvOutcome(
            KvAction.SAVE, KvResult.TIMEOUT, tokens, nbytes, seconds, f"gave up after {timeout:g} s"
        )
    return KvOutcome(
        KvAction.SAVE,
        KvResult.SAVED if saved else KvResult.EMPTY,
        tokens,
        nbytes,
        seconds,
        f"{saved} slot(s)",
    )


async def restore_into(
    http: httpx.AsyncBaseTransport,
    port: int,
    store: KvStore,
    shelf: Path,
    probe: PromptProbe | None,
    timeout: float,
) -> KvOutcome:
    """Restore into slot 0 of the new replica on ``port`` the state on ``shelf`` that shares the longest
    prefix with the prompt of ``probe`` (the request that loads the model; None: the most recent state),
    within ``timeout`` seconds."""
    started = trio.current_time()
    if not store.states(shelf):
        return KvOutcome(KvAction.RESTORE, KvResult.EMPTY)
    with trio.move_on_after(timeout):
        try:
            prompt = None
            if probe is not None:
                prompt = await prompt_tokens(http, port, probe, timeout=timeout, add_special=True)
                if prompt is None:
                    detail = "the prompt could not be tokenised"
                    return KvOutcome(
                        KvAction.RESTORE, KvResult.FAILED, 0, 0, trio.current_time() - started, detail
                    )
            found = await trio.to_thread.run_sync(store.best, shelf, prompt, MIN_SHARED_TOKENS)
            if found is None:
                return KvOutcome(KvAction.RESTORE, KvResult.NO_MATCH, 0, 0, trio.current_time() - started)
            state, shared = found
            reply = await call_json(
                http,
                "POST",
                f"http://127.0.0.1:{port}/slots/0?action=restore",
                {"filename": state.bin.name},
            )
            store.touch(state)
            restored = reply.get("n_restored") if isinstance(reply, dict) else None
            nbytes = int(reply.get("n_read") or 0) if isinstance(reply, dict) else 0
            count = shared or (restored if isinstance(restored, int) else 0)
            return KvOutcome(
                KvAction.RESTORE, KvResult.RESTORED, count, nbytes, trio.current_time() - started, state.name
            )
        except (httpx.HTTPError, OSError, ValueError) as exc:
            return KvOutcome(KvAction.RESTORE, KvResult.FAILED, 0, 0, trio.current_time() - started, str(exc))
    return KvOutcome(
        KvAction.RESTORE,
        KvResult.TIMEOUT,
        0,
        0,
        trio.current_time() - started,
        f"gave up after {timeout:g} s",
    )


async def restore_others(
    http: httpx.AsyncBaseTransport, port: int, store: KvStore, shelf: Path, skip: str | None, timeout: float
) -> list[KvOutcome]:
    """Once the replica on ``port`` serves, fill its slots that never held anything with the most recently
    used other states on ``shelf`` (``skip``: the one already restored): the conversations that were in the
    model's other slots when it stopped are the likeliest to come back next. A slot a request took meanwhile
    is left alone. Within ``timeout`` seconds in all."""
    base = f"http://127.0.0.1:{port}"
    started = trio.current_time()
    results: list[KvOutcome] = []
    with trio.move_on_after(timeout) as scope:
        try:
            states = [s for s in await trio.to_thread.run_sync(store.states, shelf) if s.name != skip]
            if not states:
                return results
            slots = await call_json(http, "GET", f"{base}/slots", None)
            used = set(_used_slots(slots))
            free = [
                slot["id"]
                for slot in (slots if isinstance(slots, list) else [])
                if isinstance(slot, dict)
                and isinstance(slot.get("id"), int)
                and slot["id"] != 0
                and slot["id"] not in used
                and not slot.get("is_processing")
            ]
            for slot, state in zip(free, states, strict=False):
                begun = trio.current_time()
                try:
                    reply = await call_json(
                        http, "POST", f"{base}/slots/{slot}?action=restore", {"filename": state.bin.name}
                    )
                except httpx.HTTPStatusError:
                    continue  # a request took the slot meanwhile
                store.touch(state)
                restored = reply.get("n_restored") if isinstance(reply, dict) else None
                nbytes = int(reply.get("n_read") or 0) if isinstance(reply, dict) else 0
                count = restored if isinstance(restored, int) else 0
                seconds = trio.current_time() - begun
                results.append(
                    KvOutcome(KvAction.RESTORE, KvResult.RESTORED, count, nbytes, seconds, state.name, slot)
                )
        except (httpx.HTTPError, OSError, ValueError) as exc:
            results.append(
                KvOutcome(KvAction.RESTORE, KvResult.FAILED, 0, 0, trio.current_time() - started, str(exc))
            )
    if scope.cancelled_caught:
        detail = f"gave up after {timeout:g} s"
        results.append(
            KvOutcome(KvAction.RESTORE, KvResult.TIMEOUT, 0, 0, trio.current_time() - started, detail)
        )
    return results
