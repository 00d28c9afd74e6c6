"""The host-memory prompt cache (--cache-ram): what a cached conversation costs, the automatic size, the
host-memory sums of the plan, and the flag on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.llama_args import llama_server_argv
from router.config.load import config_from_dict
from router.deploy.bridge import placement_inputs
from router.deploy.launch import ModelLaunch, default_decision
from router.placement.fit import plan_model
from router.placement.footprint import CPU
from router.placement.geometry import geometry_from_header
from router.placement.gguf_header import read_header
from router.placement.model_plan import DeviceRow, ModelPlan, PlacementInput
from router.placement.plan import format_plan_table, plan_document, plan_models
from router.placement.prompt_cache import (
    CRAM_MAX_MIB,
    CRAM_MIN_MIB,
    auto_cram_mib,
    host_summary,
    sequence_cost,
    size_prompt_caches,
)
from router.placement.synthetic import SyntheticModel
from tests.unit.placement_flag_models import GEMMA3_CELL, GEMMA3_SWA, GiB, MiB, header_only

# 4 layers, 4 KV heads of 32 (n_embd 256 / 8 heads): one cell of one layer is 4*32*2 (K) + 4*32*2 (V) bytes.
LLAMA = SyntheticModel()
LLAMA_CELL = 512
GEMMA, GEMMA_CELL = GEMMA3_SWA, GEMMA3_CELL  # 20 of 24 layers slide over a window of 1024
QWEN_NEXT = SyntheticModel(
    arch="qwen3next",
    n_layer=8,
    n_embd=256,
    n_head=4,
    n_head_kv=2,
    head_dim=64,
    extra=(
        (".full_attention_interval", 4),
        (".ssm.conv_kernel", 4),
        (".ssm.inner_size", 1024),
        (".ssm.state_size", 64),
        (".ssm.group_count", 4),
        (".ssm.time_step_rank", 8),
    ),
)


def _geometry(tmp_path: Path, model: SyntheticModel, name: str) -> Any:
    return geometry_from_header(read_header(header_only(tmp_path, model, name)))


# ------------------------------------------------------------------------------------------ sequence cost


def test_full_attention_costs_the_kv_bytes_per_token_times_the_prompt(tmp_path: Path) -> None:
    cost = sequence_cost(_geometry(tmp_path, LLAMA, "llama"))
    assert cost.per_token == 4 * LLAMA_CELL
    assert cost.bytes_at(1000) == 1000 * 4 * LLAMA_CELL
    assert cost.bytes_at(0) == 0
    q8 = sequence_cost(_geometry(tmp_path, LLAMA, "llama"), cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8.per_token == 4 * 2 * (128 // 32 * 34)  # quantised cache: quantised states


def test_sliding_window_layers_keep_only_their_window(tmp_path: Path) -> None:
    g = _geometry(tmp_path, GEMMA, "gemma")
    cost = sequence_cost(g)
    assert cost.per_token == 4 * GEMMA_CELL
    assert cost.window_per_cell == 20 * GEMMA_CELL and cost.window_cells == 1536  # pad256(1024 + 512)
    assert cost.bytes_at(1000) == 24 * GEMMA_CELL * 1000  # within the window every layer holds every token
    assert cost.bytes_at(8192) == 4 * GEMMA_CELL * 8192 + 20 * GEMMA_CELL * 1536
    full_attention = 24 * GEMMA_CELL * 8192
    assert cost.bytes_at(8192) < full_attention / 3  # a cached conversation costs far less
    assert sequence_cost(g, swa_full=True).bytes_at(8192) == full_attention
    assert sequence_cost(g, ubatch=1024).window_cells == 2048


def test_hybrid_models_pay_a_fixed_state_plus_their_attention_layers(tmp_path: Path) -> None:
    cost = sequence_cost(_geometry(tmp_path, QWEN_NEXT, "next"))
    floats = 3 * (1024 + 2 * 4 * 64) + 64 * 1024
    assert cost.fixed == 6 * floats * 4
    assert cost.per_token == 2 * (2 * 64 * 2 * 2)
    assert cost.bytes_at(1) - cost.bytes_at(0) == cost.per_token
    assert cost.bytes_at(4096) == cost.fixed + 4096 * cost.per_token


def test_the_plan_prices_a_full_slot_context(tmp_path: Path) -> None:
    path = header_only(tmp_path, GEMMA, "gemma")
    plan = plan_model(PlacementInput("m", path, ctx=16384, parallel=2), {0: 64 * GiB})
    assert plan.ctx_per_slot == 8192
    assert plan.state_bytes_per_token == 4 * GEMMA_CELL == plan.rows[0].kv_per_token
    assert plan.slot_state_bytes == 4 * GEMMA_CELL * 8192 + 20 * GEMMA_CELL * 1536


# ------------------------------------------------------------------------------------------ automatic size


@pytest.mark.parametrize(
    ("slot_bytes", "mib"),
    [
        (0, CRAM_MIN_MIB),
        (100 * MiB, CRAM_MIN_MIB),  # two contexts of 100 MiB: below the floor
        (300 * MiB, 600),
        (300 * MiB + 1, 601),  # rounded up to whole MiB
        (5 * GiB, CRAM_MAX_MIB),
    ],
)
def test_automatic_size_holds_two_slot_contexts_within_bounds(slot_bytes: int, mib: int) -> None:
    assert auto_cram_mib(slot_bytes) == mib


def _plan(name: str, *, host: int = 0, slot: int = 0, replicas: int = 1, verdict: str = "fits") -> ModelPlan:
    return ModelPlan(
        name=name,
        path=f"/m/{name}.gguf",
        verdict=verdict,
        message="",
        num_instance=replicas,
        host_bytes=host,
        slot_state_bytes=slot,
    )


def test_configured_figures_are_used_as_given_and_automatic_ones_sized() -> None:
    plans = [_plan("a", slot=300 * MiB), _plan("b", slot=300 * MiB), _plan("c", slot=300 * MiB)]
    sized = size_prompt_caches(plans, {"a": 0, "b": 20000, "c": None}, host_total=None)
    assert [(p.cram_mib, p.cram_source) for p in sized] == [(0, "config"), (20000, "config"), (600, "auto")]


def test_automatic_figures_share_half_of_what_the_host_has_left() -> None:
    # 16 GiB host; a keeps 4 GiB of weights on the host per replica, two replicas: 8 GiB left, half of it
    # (4096 MiB) shared by the three automatic replicas: 1365 MiB each at most.
    plans = [_plan("a", host=4 * GiB, slot=3 * GiB, replicas=2), _plan("b", slot=100 * MiB)]
    sized = size_prompt_caches(plans, {}, host_total=16 * GiB)
    assert [(p.cram_mib, p.cram_source) for p in sized] == [(1365, "host"), (CRAM_MIN_MIB, "auto")]
    starved = size_prompt_caches([_plan("a", host=20 * GiB, slot=GiB)], {}, host_total=16 * GiB)
    assert (starved[0].cram_mib, starved[0].cram_source) == (0, "host")  # nothing to spare: off


def test_a_refused_model_takes_no_share() -> None:
    plans = [_plan("a", slot=4 * GiB), _plan("big", host=100 * GiB, slot=GiB, verdict="refused")]
    sized = size_prompt_caches(plans, {}, host_total=16 * GiB)
    assert sized[0].cram_mib == CRAM_MAX_MIB  # half of 16 GiB: the refused model's weights never load


# ------------------------------------------------------------------------------------------ host memory


def test_an_overcommitted_host_is_reported_with_the_sums() -> None:
    plans = size_prompt_caches(
        [_plan("a", host=2 * GiB, replicas=2), _plan("b")], {"a": 6144, "b": 2048}, host_total=16 * GiB
    )
    summary = host_summary(plans, 16 * GiB)
    assert summary["need_bytes"] == 2 * (2 * GiB + 6 * GiB) + 2 * GiB == 18 * GiB
    assert [m["need_bytes"] for m in summary["models"]] == [16 * GiB, 2 * GiB]
    assert summary["warning"] == (
        "host memory: all replicas together may keep ~18.00 GiB in host memory (a 2 x (2.00 + prompt cache "
        "6.00); b 1 x (0.00 + prompt cache 2.00)) but the host has 16.00 GiB: lower `cram` (0 turns the "
        "prompt cache off) or num_instance, or run fewer models on the CPU"
    )
    assert host_summary(plans, 20 * GiB)["warning"] is None
    assert host_summary(plans, None)["warning"] is None  # unknown host: nothing to compare with


def test_a_model_on_the_cpu_counts_its_whole_footprint() -> None:
    row = DeviceRow(CPU, 4, 3 * GiB, 0, GiB, 0, 0, 0, 4 * GiB, 8 * GiB)
    plan = size_prompt_caches(
        [ModelPlan("cpu", "/m/c.gguf", "fits", "", rows=(row,))], {"cpu": 1024}, host_total=None
    )
    (entry,) = host_summary(plan, 8 * GiB)["models"]
    assert entry["host_bytes"] == 4 * GiB and entry["need_bytes"] == 5 * GiB


def test_the_plan_document_and_table_show_each_models_prompt_cache(tmp_path: Path) -> None:
    path = header_only(tmp_path, LLAMA, "llama")
    inputs = [PlacementInput("auto", path, ctx=4096), PlacementInput("set", path, ctx=4096, cram=4096)]
    devices: dict[Any, int | None] = {0: 64 * GiB, CPU: 6 * GiB}
    doc = plan_document(plan_models(inputs, devices), devices)
    auto, configured = doc["models"]
    assert (auto["cram_mib"], auto["cram_source"]) == (CRAM_MIN_MIB, "auto")
    assert auto["slot_state_bytes"] == 4096 * 4 * LLAMA_CELL and auto["state_bytes_per_token"] == 2048
    assert (configured["cram_mib"], configured["cram_source"]) == (4096, "config")
    assert doc["host"]["total_bytes"] == 6 * GiB and doc["host"]["warning"] is None
    table = format_plan_table(doc)
    header = next(line for line in table.splitlines() if line.startswith("model "))
    assert header.split()[-3:] == ["cram", "host", "replicas"]
    assert "256 (auto)" in table and " 4096 " in table
    over = plan_document(plan_models(inputs, {0: 64 * GiB, CPU: 4 * GiB}), {0: 64 * GiB, CPU: 4 * GiB})
    assert over["host"]["warning"] and over["host"]["warning"] in format_plan_table(over)


# ------------------------------------------------------------------------------------------ command line


def test_the_figure_reaches_the_command_line(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "defaults": {"cram": 512},
            "models": {"a": {"model": "/m/a.gguf"}, "b": {"model": "/m/b.gguf", "cram": 0}},
        }
    )
    argv = llama_server_argv("llama-server", config.models["a"], {}, port=1, ctx=512, gpu_layers=0)
    assert "--cache-ram" not in argv  # without a figure llama-server keeps its own default
    with_cache = llama_server_argv(
        "llama-server", config.models["a"], {}, port=1, ctx=512, gpu_layers=0, cache_ram_mib=512
    )
    assert with_cache[with_cache.index("off") + 1 :] == ["--cache-ram", "512"]
    decision = default_decision(config.models["b"])
    assert decision.cram_mib == 0
    launch = ModelLaunch(config.models["b"], "llama-server", {}, (0,), 512, 99, cram_mib=decision.cram_mib)
    argv_b = launch.argv(1)
    assert argv_b[argv_b.index("--cache-ram") + 1] == "0"
    assert default_decision(config_from_dict({"models": {"c": {"model": "/m/c"}}}).models["c"]).cram_mib == (
        CRAM_MIN_MIB
    )
    inputs = placement_inputs(config, (0,))
    assert [inp.cram for inp in inputs] == [512, 0]
