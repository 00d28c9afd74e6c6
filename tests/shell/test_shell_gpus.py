"""GPUs through the real router: residency per GPU, eviction choice, replicas, masking and command lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.client import chat_body, post_chat, start_post, start_stream
from tests.support.harness import RouterHandle, queued_for, running_router
from tests.support.simtools import read_records

MANY = {"tokens": 1000}


def happenings(h: RouterHandle, kind: str, model: str | None = None) -> list[Any]:
    return [x for x in h.router.happenings if x.kind == kind and (model is None or x.model == model)]


@pytest.mark.parametrize("declared", ["num_gpus", "devices"])
async def test_models_on_disjoint_gpus_stay_resident_and_a_swap_does_not_pause_the_other(
    tmp_path: Path, declared: str
) -> None:
    models = {
        "a": {"gpus": [0], "sim": MANY},
        "b": {"gpus": [1], "sim": MANY},
        "c": {"gpus": [0], "sim": {**MANY, "load_delay": 1.0}},
    }
    router: dict[str, Any] = {"max_models_per_gpu": 1}
    devices: dict[str, Any] = {}
    if declared == "num_gpus":
        router["num_gpus"] = 2
    else:
        devices = {"0": {}, "1": {}}
    async with (
        running_router(tmp_path, models, router=router, devices=devices) as h,
        trio.open_nursery() as nursery,
    ):
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        assert (await post_chat(h.client, "b", max_tokens=1)).status_code == 200
        status = await h.status()
        residents = {g["id"]: g["residents"] for g in status["gpus"]}
        assert residents == {0: ["a"], 1: ["b"]}
        states = sorted((r["model"], r["state"]) for r in status["replicas"])
        assert states == [("a", "ready"), ("b", "ready")]

        seen: dict[tuple[str, str], float] = {}  # (happening, model): when the owner noted it first
        h.router.listeners.append(
            lambda kind, data: seen.setdefault(
                (getattr(kind, "value", kind), data["model"]), trio.current_time()
            )
        )
        long = start_stream(nursery, h.client, chat_body("b", max_tokens=120))
        await long.first_token.wait()
        swap = await post_chat(h.client, "c", max_tokens=2)
        assert swap.status_code == 200
        await long.done.wait()
        status = await h.status()

    reply = long.stream
    assert reply.done and not reply.errors
    # The whole swap on GPU 0 (stop a, load c) happened while b streamed on GPU 1 ...
    loading, ready = seen[("load", "c")], seen[("ready", "c")]
    assert reply.first_token_at < seen[("stop", "a")] < loading < ready < reply.last_token_at
    # ... and b's tokens kept coming while c loaded (a second, in which b makes about 50).
    assert sum(loading < at < ready for at in reply.token_times) >= 10
    residents = {g["id"]: g["residents"] for g in status["gpus"]}
    assert residents == {0: ["c"], 1: ["b"]}
    assert [x.model for x in happenings(h, "stop")] == ["a"]
    assert len(read_records(h.records_of("b"))) == 1


@pytest.mark.parametrize(("eviction", "victim"), [("lru", "y"), ("fifo", "x")])
async def test_eviction_policy_picks_the_victim(tmp_path: Path, eviction: str, victim: str) -> None:
    """x loads first, y second, then x is used again: lru evicts y (used longest ago), fifo evicts x
    (loaded first)."""
    models = {name: {"sim": MANY} for name in ("x", "y", "z")}
    router = {"max_models_per_gpu": 2, "eviction": eviction}
    async with running_router(tmp_path, models, router=router) as h:
        for name in ("x", "y", "x"):
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
        assert (await post_chat(h.client, "z", max_tokens=1)).status_code == 200
        status = await h.status()
    stops = happenings(h, "stop")
    assert [x.model for x in stops] == [victim]
    assert f"evicted ({eviction})" in stops[0].reason and "'z'" in stops[0].reason
    survivor = {"x", "y"} - {victim}
    assert status["gpus"][0]["residents"] == sorted({*survivor, "z"})


async def test_a_resident_with_queued_work_is_evicted_last(tmp_path: Path) -> None:
    """fifo would evict x (loaded first), but x has a request waiting for its slot; y goes instead."""
    models = {name: {"sim": MANY} for name in ("x", "y", "z")}
    router = {"max_models_per_gpu": 2, "eviction": "fifo"}
    async with running_router(tmp_path, models, router=router) as h, trio.open_nursery() as nursery:
        assert (await post_chat(h.client, "x", max_tokens=1)).status_code == 200
        assert (await post_chat(h.client, "y", max_tokens=1)).status_code == 200
        busy = start_stream(nursery, h.client, chat_body("x", max_tokens=40))
        await busy.first_token.wait()
        waiting = start_post(nursery, h.client, chat_body("x", max_tokens=2))
        await h.wait_state(lambda s: queued_for(s, "x") == 1)
        z = await post_chat(h.client, "z", max_tokens=2)
        assert z.status_code == 200
        await waiting.done.wait()
        await busy.done.wait()
    assert [x.model for x in happenings(h, "stop")] == ["y"]
    assert waiting.response is not None and waiting.response.status_code == 200
    assert busy.stream.done and not busy.stream.errors
    assert len(read_records(h.records_of("x"))) == 1


async def test_two_instances_share_the_load_by_requests_in_flight(tmp_path: Path) -> None:
    models = {"a": {"num_instance": 2, "parallel": 2, "sim": MANY}}
    async with running_router(tmp_path, models) as h, trio.open_nursery() as nursery:
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        await h.wait_ready("a", 2)
        first = start_stream(nursery, h.client, chat_body("a", max_tokens=40))
        await first.first_token.wait()
        second = start_stream(nursery, h.client, chat_body("a", max_tokens=40))
        await second.first_token.wait()
        status = await h.status()
        await first.done.wait()
        await second.done.wait()
    replicas = [r for r in status["replicas"] if r["model"] == "a"]
    assert len(replicas) == 2
    assert sorted(r["in_flight"] for r in replicas) == [1, 1]
    records = read_records(h.records_of("a"))
    assert len(records) == 2
    assert {r["pid"] for r in records} == {r["pid"] for r in replicas}
    assert {r["port"] for r in records} == {r["port"] for r in replicas}


def _env_of(records: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    assert len(records) == 1
    env = records[0]["env"]
    return env["CUDA_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"]


async def test_replicas_see_only_their_gpus(tmp_path: Path) -> None:
    models = {
        "listed": {"gpus": [1, 2], "sim": {}},
        "every": {"gpus": "all", "sim": {}},
        "plain": {"sim": {}},
    }
    router = {"num_gpus": 3, "max_models_per_gpu": 3}
    async with running_router(tmp_path, models, router=router) as h:
        for name in models:
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
        doc = await h.models()
    assert _env_of(read_records(h.records_of("listed"))) == ("1,2", "1,2")
    assert _env_of(read_records(h.records_of("every"))) == ("0,1,2", "0,1,2")
    assert _env_of(read_records(h.records_of("plain"))) == ("0", "0")
    gpus = {m["id"]: m["gpus"] for m in doc["data"]}
    assert gpus == {"listed": [1, 2], "every": [0, 1, 2], "plain": [0]}


def _value_after(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


async def test_command_line_carries_router_flags_and_pass_through_flags(tmp_path: Path) -> None:
    models = {
        "tuned": {
            "ctx": 2048,
            "parallel": 2,
            "gpu_layers": 20,
            "cram": 3000,
            "ctk": "q4_0",
            "flash-attn": "on",
            "override-kv": ["a=int:1", "b=int:2"],
            "sim": {},
        },
        "plain": {"no-warmup": False, "sim": {}},
    }
    defaults = {"metrics": True, "ctk": "q8_0", "threads": 3, "no-warmup": True}
    router = {"max_models_per_gpu": 2}
    async with running_router(tmp_path, models, router=router, defaults=defaults) as h:
        for name in models:
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
        ports = {r["model"]: r["port"] for r in (await h.status())["replicas"]}

    tuned = read_records(h.records_of("tuned"))[0]["argv"]
    assert _value_after(tuned, "--fit") == "off"
    assert _value_after(tuned, "-c") == "2048"
    assert _value_after(tuned, "-np") == "2"
    assert _value_after(tuned, "-ngl") == "20"
    assert _value_after(tuned, "--host") == "127.0.0.1"
    assert _value_after(tuned, "--port") == str(ports["tuned"])
    assert _value_after(tuned, "-m").endswith("tuned.json")
    assert _value_after(tuned, "-ctk") == "q4_0"  # the model's value replaces the default
    assert _value_after(tuned, "--flash-attn") == "on"
    assert _value_after(tuned, "--threads") == "3"
    assert _value_after(tuned, "--cache-ram") == "3000"
    assert "--metrics" in tuned and "--no-warmup" in tuned
    kv = [tuned[i + 1] for i, word in enumerate(tuned) if word == "--override-kv"]
    assert kv == ["a=int:1", "b=int:2"]

    plain = read_records(h.records_of("plain"))[0]["argv"]
    assert _value_after(plain, "--fit") == "off"
    assert _value_after(plain, "-c") == "4096"
    assert _value_after(plain, "-np") == "1"
    assert _value_after(plain, "-ctk") == "q8_0"
    assert "--metrics" in plain
    assert "--no-warmup" not in plain  # false in the model drops the default
    # No header to size its prompt cache from (the simulator's model is no GGUF): the smallest figure.
    assert _value_after(plain, "--cache-ram") == "256"
