"""How the llama-server flags that move memory are read (spellings, merging, false), split modes, and
the flags placement cannot model, refused by name.

Headers are synthetic (no weights); expected byte counts are worked out by hand (see
tests/unit/placement_flag_models.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.load import load_config
from router.deploy.bridge import placement_inputs
from router.deploy.memory_flags import EXPERTS_REGEX, flash_attn, memory_flags
from router.placement.extras import DraftInput
from router.placement.fit import plan_model
from router.placement.model_plan import PlacementInput
from router.placement.synthetic import SyntheticModel
from tests.support.client import post_chat
from tests.support.harness import running_router
from tests.support.simtools import write_sim_sidecar
from tests.unit.placement_flag_models import ROOMY, header_only, plan_of

# ------------------------------------------------------------------------------------- split mode


def test_operator_tensor_split_replaces_the_budget_split(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(n_layer=7), "m")
    plan = plan_of(path, gpus=(0, 1), tensor_split=(3.0, 1.0))
    assert [r.layers for r in plan.rows] == [6, 1]  # 8 slots at 3:1: blocks 0-5 | block 6 and the output
    assert plan.tensor_split == ()  # the operator's --tensor-split is already on the command line
    none = memory_flags({}, {"sm": "none"}, n_gpus=2, base_dir=tmp_path)
    assert none.tensor_split == (1.0, 0.0) and not none.unsupported
    assert memory_flags({}, {"ts": "3/1"}, n_gpus=2, base_dir=tmp_path).tensor_split == (3.0, 1.0)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"sm": "row"}, "-sm row (splits each weight matrix by rows across the GPUs"),
        ({"split-mode": "tensor"}, "--split-mode tensor (splits weights and the KV cache"),
        ({"lora": "adapter.gguf"}, "--lora (LoRA adapter"),
        ({"lora-scaled": "adapter.gguf:0.5"}, "--lora-scaled (LoRA adapter"),
        ({"control-vector": "cv.gguf"}, "--control-vector (control vectors"),
        ({"control-vector-layer-range": "1 4"}, "--control-vector-layer-range (control vectors"),
        ({"rpc": "10.0.0.2:50052"}, "--rpc (layers may be placed on remote devices"),
        ({"-devd": "CUDA1", "-md": "d.gguf"}, "-devd (a device name"),
        ({"ub": "big"}, "-ub big (not a whole number)"),
        ({"b": 0}, "-b 0 (must be at least 1)"),
    ],
)
def test_what_placement_cannot_model_is_refused_by_name(
    tmp_path: Path, flags: dict[str, Any], named: str
) -> None:
    reading = memory_flags({}, flags, n_gpus=2, base_dir=tmp_path)
    assert any(r.startswith(named) for r in reading.unsupported), reading.unsupported
    path = header_only(tmp_path, SyntheticModel(), "m")
    plan = plan_model(PlacementInput("m", path, gpus=(0, 1), unsupported=reading.unsupported), ROOMY)
    assert plan.verdict == "refused" and not plan.ok and plan.rows == () and plan.ctx is None
    assert plan.message.startswith("m: placement cannot predict the memory of ") and named in plan.message


def test_row_split_on_one_gpu_is_just_that_gpu(tmp_path: Path) -> None:
    assert memory_flags({}, {"sm": "row"}, n_gpus=1, base_dir=tmp_path).unsupported == ()


# ---------------------------------------------------------------------------------- flag reading


def test_spellings_merging_and_false(tmp_path: Path) -> None:
    read = memory_flags({"ub": 1024, "b": 4096, "-kvu": True}, {}, n_gpus=1, base_dir=tmp_path)
    assert (read.ubatch, read.batch, read.kv_unified) == (1024, 4096, True)
    # the model's value replaces the default's; false drops it
    read = memory_flags(
        {"ub": 1024, "kvu": True}, {"--ubatch-size": "2048", "kv-unified": False}, n_gpus=1, base_dir=tmp_path
    )
    assert (read.ubatch, read.kv_unified) == (2048, False)
    read = memory_flags({"ub": 1024}, {"ub": False}, n_gpus=1, base_dir=tmp_path)
    assert read.ubatch == 512
    # a negative form later on the command line wins
    read = memory_flags(
        {"kvu": True, "nkvo": True}, {"no-kvu": True, "kvo": True}, n_gpus=1, base_dir=tmp_path
    )
    assert (read.kv_unified, read.kv_offload) == (False, True)
    read = memory_flags(
        {}, {"swa-full": True, "nkvo": True, "no-op-offload": True}, n_gpus=1, base_dir=tmp_path
    )
    assert (read.swa_full, read.kv_offload, read.op_offload) == (True, False, False)


def test_flash_attention_values() -> None:
    assert flash_attn({}, {}) is True
    assert flash_attn({"fa": "off"}, {}) is False
    assert flash_attn({"fa": "disabled"}, {}) is False
    assert flash_attn({"fa": "off"}, {"fa": False}) is True  # false drops the flag: llama-server's auto
    assert flash_attn({"--flash-attn": "on"}, {}) is True


def test_paths_and_draft_flags(tmp_path: Path) -> None:
    read = memory_flags(
        {"ctkd": "q8_0"},
        {
            "mmproj": "proj/mm.gguf",
            "no-mmproj-offload": True,
            "--spec-draft-model": "~/d.gguf",
            "ngld": 5,
            "cd": 1024,
            "ctvd": "q4_0",
            "ncmoed": 1,
            "spec-draft-n-max": 8,
        },
        n_gpus=1,
        base_dir=tmp_path,
    )
    assert read.mmproj == tmp_path / "proj" / "mm.gguf" and read.mmproj_offload is False
    draft = read.draft
    assert draft is not None and draft.path == Path("~/d.gguf").expanduser()
    assert (draft.gpu_layers, draft.ctx, draft.cache_type_k, draft.cache_type_v, draft.n_max) == (
        5,
        1024,
        "q8_0",
        "q4_0",
        8,
    )
    assert draft.host_patterns == (rf"blk\.0{EXPERTS_REGEX}",)
    assert memory_flags(
        {}, {"md": "/d.gguf", "ngld": "all"}, n_gpus=1, base_dir=tmp_path
    ).draft == DraftInput("/d.gguf")
    # draft flags without a draft model mean nothing
    assert memory_flags({}, {"ngld": 3, "ctkd": "q8_0"}, n_gpus=1, base_dir=tmp_path).draft is None


def test_placement_inputs_read_the_config(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(
        "[defaults]\nub = 1024\nkvu = true\n\n"
        '[models.m]\nmodel = "m.gguf"\ngpus = [0]\nmmproj = "proj/mm.gguf"\nub = false\n'
        '"--n-cpu-moe" = 2\nb = 256\n'
    )
    (inp,) = placement_inputs(load_config(config, env={}), (0,))
    assert (inp.ubatch, inp.batch, inp.kv_unified) == (512, 256, True)
    assert inp.mmproj == tmp_path / "proj" / "mm.gguf"
    assert inp.host_flags == ("--n-cpu-moe 2",) and len(inp.host_patterns) == 2


async def test_a_refused_flag_reaches_the_client_by_name(tmp_path: Path) -> None:
    path = header_only(tmp_path, SyntheticModel(), "m")
    write_sim_sidecar(path, load_delay=0.05, record_dir=str(tmp_path / "records"))
    models = {"m": {"sim": {}, "model": str(path), "gpus": [0, 1], "sm": "row"}}
    devices = {"0": {"memory_mib": 4096}, "1": {"memory_mib": 4096}}
    async with running_router(tmp_path, models, devices=devices) as rt:
        reply = await post_chat(rt.client, "m")
        assert reply.status_code == 503
        message = reply.json()["error"]["message"]
        assert "placement cannot predict the memory of -sm row (splits each weight matrix" in message
