"""Placement decisions reach the scheduler, the replica's argv and the client's error message."""

from __future__ import annotations

from pathlib import Path

from router.placement.synthetic import SyntheticModel
from tests.support.client import post_chat
from tests.support.harness import running_router
from tests.support.simtools import placed_sim_model, read_records
from tests.support.waiting import until

MIB = 1 << 20

# ~2.6 GiB of f16 weights in the blocks: never fits a 1 GiB GPU at full offload.
BIG = SyntheticModel(n_layer=8, n_embd=4096, n_head=32, n_head_kv=8, n_ff=11008, n_vocab=1024)
# ~25 MiB: fits, and spans two GPUs.
SMALL = SyntheticModel(
    n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_vocab=1024, n_ctx_train=8192
)


async def test_a_model_that_never_fits_is_refused_with_the_arithmetic(tmp_path: Path) -> None:
    models = {
        "big": {"sim": {}, "model": placed_sim_model(tmp_path / "gguf", "big", BIG), "gpus": [0]},
        "small": {"sim": {}, "model": placed_sim_model(tmp_path / "gguf", "small", SMALL), "gpus": [0, 1]},
    }
    devices = {"0": {"memory_mib": 1024}, "1": {"memory_mib": 1024}}
    async with running_router(tmp_path, models, devices=devices) as rt:
        reply = await post_chat(rt.client, "big")
        assert reply.status_code == 503
        message = reply.json()["error"]["message"]
        assert "big needs ~" in message and "GPU 0 has 1.0 GiB" in message, message
        assert "weights" in message and "KV" in message

        plan = (await rt.client.get("/plan")).json()
        verdicts = {m["name"]: m["verdict"] for m in plan["models"]}
        assert plan["version"] == 1 and verdicts == {"big": "refused", "small": "fits"}

        reply = await post_chat(rt.client, "small")
        assert reply.status_code == 200, reply.text
        spec = rt.router.state.settings.models["small"]
        assert set(spec.need) == {0, 1} and all(n > 0 for n in spec.need.values())
        await until(lambda: read_records(rt.records_of("small")), timeout=5)
        argv = read_records(rt.records_of("small"))[-1]["argv"]
        chosen = next(m for m in plan["models"] if m["name"] == "small")
        assert argv[argv.index("-c") + 1] == str(chosen["ctx"])
        assert argv[argv.index("-ngl") + 1] == str(chosen["gpu_layers"])
        assert "--tensor-split" in argv
        assert argv[argv.index("--cache-ram") + 1] == str(chosen["cram_mib"])
        assert chosen["cram_source"] in ("auto", "host") and chosen["slot_state_bytes"] > 0
        assert plan["host"]["models"][0]["name"] == "small"  # a refused model keeps no host memory
