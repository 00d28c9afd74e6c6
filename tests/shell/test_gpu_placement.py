"""Models the scheduler places (``gpus = "any"``) on a host of mixed cards, through the real pynvml on the
stand-in libnvidia-ml.so.1 (tests/support/fakenvml) and the simulated llama-server: which card each load
went to is read from the started processes' own CUDA_VISIBLE_DEVICES, and other processes' memory is grown
on the stand-in while the router runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.placement.synthetic import SyntheticModel
from tests.support.client import post_chat
from tests.support.fakenvml import FakeNvml, fake_nvml_fixture  # noqa: F401  (the `fake_nvml` fixture)
from tests.support.harness import RouterHandle, running_router
from tests.support.simtools import placed_sim_model, read_records
from tests.support.waiting import until

MIB = 1 << 20

# About 0.55 GiB of f16 weights, trained to 4096 tokens: fits each card below alone.
MODEL = SyntheticModel(
    n_layer=6, n_embd=1536, n_head=12, n_head_kv=4, n_ff=4096, n_vocab=1024, n_ctx_train=4096
)


def mixed_cards(fake: FakeNvml) -> None:
    """Cards of 6, 3 and 2 GiB (GPUs 0, 1, 2), each with 100 MiB taken by the driver."""
    fake.gpu(0, 6144, used_mib=100, name="NVIDIA Fake 6GB", bus_id="00000000:01:00.0")
    fake.gpu(1, 3072, used_mib=100, name="NVIDIA Fake 3GB", bus_id="00000000:02:00.0")
    fake.gpu(2, 2048, used_mib=100, name="NVIDIA Fake 2GB", bus_id="00000000:03:00.0")


def anywhere(tmp_path: Path, name: str, **table: Any) -> dict[str, Any]:
    return {"model": placed_sim_model(tmp_path / "gguf", name, MODEL, gpu_mib=600), "gpus": "any", **table}


async def cards_of(h: RouterHandle, model: str, count: int = 1) -> list[str]:
    """The CUDA_VISIBLE_DEVICES of the first ``count`` replicas of ``model`` started, oldest first."""

    def records() -> list[dict[str, Any]] | None:
        found = read_records(h.records_of(model))
        return found if len(found) >= count else None

    found = await until(records, what=f"{count} start record(s) of {model}")
    return [r["env"]["CUDA_VISIBLE_DEVICES"] for r in found]


async def test_each_model_goes_to_the_card_with_the_most_room_and_plan_explains_it(
    tmp_path: Path, fake_nvml: FakeNvml
) -> None:
    mixed_cards(fake_nvml)
    models = {name: anywhere(tmp_path, name) for name in ("a", "b", "c")}
    async with running_router(tmp_path, models) as h:
        plan = {m["name"]: m for m in (await h.client.get("/plan")).json()["models"]}
        sets = [s["gpus"] for s in plan["a"]["placement"]["sets"]]
        assert sets[:3] == [[0], [1], [2]], sets
        assert "placed by the scheduler at each load on one GPU: GPU 0" in plan["a"]["message"]
        for name in ("a", "b", "c"):
            assert (await post_chat(h.client, name, max_tokens=1)).status_code == 200
        # One model per card (the default cap): the most free memory first, so every card is used.
        assert [(await cards_of(h, n))[0] for n in ("a", "b", "c")] == ["0", "1", "2"]
        status = await h.status()
        residents = {g["id"]: g["residents"] for g in status["gpus"]}
        assert residents == {0: ["a"], 1: ["b"], 2: ["c"]}


async def test_replicas_spread_over_cards(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    mixed_cards(fake_nvml)
    models = {"a": anywhere(tmp_path, "a", num_instance=2)}
    async with running_router(tmp_path, models) as h:
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        assert sorted(await cards_of(h, "a", 2)) == ["0", "1"]


async def test_memory_another_process_takes_sends_the_next_load_elsewhere(
    tmp_path: Path, fake_nvml: FakeNvml
) -> None:
    """A game takes 5 GiB of the big card while the router runs: the scheduler hears of it, the next load
    goes to the 3 GiB card without any failed start, and /status says why; once the game quits, the big card
    is used again."""
    mixed_cards(fake_nvml)
    models = {"a": anywhere(tmp_path, "a", ttl=0.5)}
    async with running_router(tmp_path, models) as h:
        fake_nvml.proc(0, 31337, 5120)

        async def told() -> dict[str, Any] | None:
            gpu0 = next(g for g in (await h.status())["gpus"] if g["id"] == 0)
            return gpu0 if gpu0["others_beyond_budget_bytes"] else None

        gpu0 = await until(told, what="the scheduler hearing of the game's memory")
        assert "other processes hold" in gpu0["warning"] and "beyond its budget" in gpu0["warning"]
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        assert await cards_of(h, "a") == ["1"]
        assert not [e for e in h.router.happenings if e.kind == "load_refused"]
        fake_nvml.remove_proc(0, 31337)

        async def back() -> bool:
            gpu0 = next(g for g in (await h.status())["gpus"] if g["id"] == 0)
            gone = not any(r.model == "a" for r in h.router.state.replicas)
            return gone and not gpu0["others_beyond_budget_bytes"]

        await until(back, what="the game's memory back and a's replica stopped by its ttl")
        assert (await post_chat(h.client, "a", max_tokens=1)).status_code == 200
        assert (await cards_of(h, "a", 2))[1] == "0"
