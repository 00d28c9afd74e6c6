"""Which replicas keep their prompt caches: the shelf and prompt a replica is started with, and which stops
ask for its slots to be saved first (idle replicas of models that keep caches; never a forced stop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from router.shell.prompts import PromptProbe
from tests.support.fake_supervisor import dispatched, owned_router, settle

CHAT = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]}


def _save_path(argv: tuple[str, ...]) -> str | None:
    return argv[argv.index("--slot-save-path") + 1] if "--slot-save-path" in argv else None


async def test_a_replica_starts_on_its_shelf_with_the_prompt_that_loads_it(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {}}, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = router.admit("a", asked="a", endpoint="/v1/chat", client="t", tokens=8, body=CHAT)
        await settle()
        spec = sup.spawns[0]
        assert spec.kv is not None
        assert spec.kv.shelf.parent == tmp_path / "kv" and spec.kv.shelf.is_dir()
        assert spec.kv.shelf.name.startswith("a-")
        assert _save_path(spec.argv) == str(spec.kv.shelf)
        assert spec.kv.probe == PromptProbe(messages=(("system", "You are terse."), ("user", "hi")))
        assert spec.kv.timeout == 5.0
        sup.ready(1)
        await ticket.decided.wait()
        ticket.end(completed=True)
        router.unload("a", False)
        await settle()
        assert [k.save for k in sup.kills] == [True]
        sup.exit_killed()
        await settle()
        again = router.admit("a", asked="a", endpoint="/v1/completions", client="t", tokens=8, body={})
        await settle()
        # The same model file and flags: the same shelf. A body without a prompt restores the latest state.
        assert sup.spawns[1].kv is not None and sup.spawns[1].kv.shelf == spec.kv.shelf
        assert sup.spawns[1].kv.probe is None
        again.end(completed=False)


async def test_other_cache_flags_mean_another_shelf(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    models: dict[str, Any] = {"a": {"parallel": 1}, "b": {"parallel": 2}}
    both = {"max_models_per_gpu": 2}
    async with owned_router(tmp_path, models, launcher=launcher, router=both) as owned:
        await dispatched(owned, "a")
        await dispatched(owned, "b")
        shelves = [s.kv.shelf for s in owned.supervisor.spawns if s.kv is not None]
        assert len(shelves) == 2 and shelves[0] != shelves[1]


async def test_a_model_that_opts_out_neither_saves_nor_restores(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {"kv_store": False}, "b": {}}, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        ticket = await dispatched(owned, "a")
        assert sup.spawns[0].kv is None and _save_path(sup.spawns[0].argv) is None
        ticket.end(completed=True)
        router.unload("a", False)
        await settle()
        assert [k.save for k in sup.kills] == [False]
        sup.exit_killed()
        await dispatched(owned, "b")
        assert sup.spawns[1].kv is not None


async def test_the_router_switch_turns_it_off_for_every_model(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {}}, launcher=launcher, router={"kv_store": False}) as owned:
        ticket = await dispatched(owned, "a")
        assert owned.supervisor.spawns[0].kv is None
        ticket.end(completed=True)
        owned.router.unload("a", False)
        await settle()
        assert [k.save for k in owned.supervisor.kills] == [False]
        assert not (tmp_path / "kv").exists()


async def test_a_forced_stop_of_a_busy_replica_saves_nothing(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {}}, launcher=launcher) as owned:
        ticket = await dispatched(owned, "a")
        owned.router.unload("a", True)  # forced: the request in flight is cut off
        await settle()
        assert [k.save for k in owned.supervisor.kills] == [False]
        ticket.end(completed=False)


async def test_an_evicted_replica_saves_first(
    tmp_path: Path, launcher: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with owned_router(tmp_path, {"a": {}, "b": {}}, launcher=launcher) as owned:
        router, sup = owned.router, owned.supervisor
        first = await dispatched(owned, "a")
        first.end(completed=True)
        await settle()
        second = router.admit("b", asked="b", endpoint="/v1/chat/completions", client="t", tokens=8)
        await settle()
        assert [(k.replica, k.save) for k in sup.kills] == [(1, True)]
        assert "evict" in sup.kills[0].reason
        second.end(completed=False)
