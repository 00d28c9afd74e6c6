"""Fit verdicts, the plan document and device budgets, on synthetic headers (no weights)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from router.placement.budgets import DeviceBudget, budget_bytes, gather_budgets, host_budget
from router.placement.fit import decide, plan_model
from router.placement.footprint import CPU, estimate
from router.placement.geometry import geometry_from_header
from router.placement.gguf_header import read_header
from router.placement.model_plan import ModelPlan, PlacementInput
from router.placement.plan import format_plan_table, plan_document, plan_models
from router.placement.synthetic import SyntheticModel, write_header_only

MiB = 1 << 20
GiB = 1 << 30

# ~1.3 GiB of f16 weights: 16 layers of n_embd 2048, GQA 4:1, 32k vocab, trained on 32k tokens.
MODEL = SyntheticModel(
    n_layer=16, n_embd=2048, n_head=16, n_head_kv=4, n_ff=5632, n_vocab=32000, n_ctx_train=32768
)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    (path,) = write_header_only(tmp_path / "m.gguf", MODEL)
    return path


def need_at(path: Path, ctx: int, devices: tuple[Any, ...] = (0,), **kw: Any) -> list[int]:
    g = geometry_from_header(read_header(path))
    return [d.total for d in estimate(g, devices, ctx=ctx, **kw).devices]


def test_fits_with_room_takes_the_trained_context(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path), {0: 24 * GiB})
    assert plan.verdict == "fits" and plan.ok
    assert plan.ctx == 32768 and plan.ctx_per_slot == 32768 and plan.trained_ctx == 32768
    assert plan.gpu_layers == 17  # every block and the output layer
    assert plan.need_by_gpu == {0: plan.rows[0].total}
    assert plan.rows[0].budget == 24 * GiB


def test_chooses_the_largest_context_that_fits(model_path: Path) -> None:
    budget = need_at(model_path, 9216)[0] - 1  # one byte short of the next 256 step
    plan = plan_model(PlacementInput("m", model_path), {0: budget})
    assert plan.verdict == "fits"
    assert plan.ctx == 8960
    assert need_at(model_path, 8960)[0] <= budget < need_at(model_path, 8960 + 256)[0]
    assert plan.rows[0].total == need_at(model_path, 8960)[0]


def test_slots_share_the_context(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path, parallel=4), {0: 64 * GiB})
    assert plan.ctx == 32768 and plan.ctx_per_slot == 8192  # the trained context, shared by the slots
    budget = need_at(model_path, 4 * 2560, n_seq=4)[0]
    plan = plan_model(PlacementInput("m", model_path, parallel=4), {0: budget})
    assert (plan.ctx, plan.ctx_per_slot) == (4 * 2560, 2560)
    # 3 slots: multiples of 768 only, so each slot gets whole 256-cell blocks
    plan = plan_model(PlacementInput("m", model_path, parallel=3), {0: 64 * GiB})
    assert (plan.ctx, plan.ctx_per_slot) == (32256, 10752)


def test_refusal_states_the_arithmetic_and_never_offloads_partially(model_path: Path) -> None:
    floor_need = need_at(model_path, 2048)[0]
    plan = plan_model(PlacementInput("qwen", model_path), {0: floor_need - 1})
    assert plan.verdict == "refused" and not plan.ok
    assert plan.ctx is None and plan.ctx_tried == 2048
    assert plan.gpu_layers == 17  # the prediction is for full offload: no layer moved to the CPU
    row = plan.rows[0]
    assert row.total == floor_need
    pattern = (
        r"^qwen needs ~(\d+\.\d) GiB on GPU 0 \(weights (\d+\.\d) \+ KV at 2048 ctx (\d+\.\d) \+ "
        r"compute (\d+\.\d) \+ reserve 0\.5\) but GPU 0 has (\d+\.\d) GiB: "
        r"choose a smaller quant or context, or free VRAM$"
    )
    m = re.match(pattern, plan.message)
    assert m, plan.message
    total, weights, kv, compute, budget = (float(x) for x in m.groups())
    assert total == round(row.total / GiB, 1)
    assert weights == round(row.weights / GiB, 1) and kv == round(row.kv / GiB, 1)
    assert compute == round(row.compute / GiB, 1)
    assert budget == round((floor_need - 1) / GiB, 1)


def test_refusal_on_one_of_two_gpus(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path, gpus=(0, 1)), {0: 24 * GiB, 1: 200 * MiB})
    assert plan.verdict == "refused"
    assert "GPU 1 (" in plan.message and "but GPU 1 has 0.2 GiB" in plan.message
    assert "GPU 0 (" not in plan.message


def test_floor_with_slots(model_path: Path) -> None:
    # floor 2048 over 3 slots: the first multiple of 768 at or above it is 2304 (768 per slot)
    need = need_at(model_path, 2304, n_seq=3)[0]
    assert plan_model(PlacementInput("m", model_path, parallel=3), {0: need}).ctx == 2304
    refused = plan_model(PlacementInput("m", model_path, parallel=3), {0: need - 1})
    assert refused.verdict == "refused" and "KV at 2304 ctx" in refused.message
    # 16 slots: at least one 256-cell block each, even above the floor
    many = plan_model(PlacementInput("m", model_path, parallel=16, ctx_floor=1024), {0: 64 * GiB})
    assert (many.ctx, many.ctx_per_slot) == (32768, 2048)


def test_floor_above_the_trained_context_is_capped(tmp_path: Path) -> None:
    (path,) = write_header_only(tmp_path / "short.gguf", SyntheticModel(n_ctx_train=1000))
    plan = plan_model(PlacementInput("m", path), {0: 24 * GiB})
    assert plan.verdict == "fits" and plan.ctx == 768


def test_ctx_floor_is_configurable(model_path: Path) -> None:
    need = need_at(model_path, 1024)[0]
    plan = plan_model(PlacementInput("m", model_path, ctx_floor=1024), {0: need})
    assert plan.verdict == "fits" and plan.ctx == 1024
    assert plan_model(PlacementInput("m", model_path), {0: need}).verdict == "refused"


def test_replicas_each_need_the_full_amount(model_path: Path) -> None:
    one = need_at(model_path, 2048)[0]
    plan = plan_model(PlacementInput("m", model_path, num_instance=2), {0: 2 * one})
    assert plan.verdict == "fits" and plan.ctx == 2048
    assert plan.need_by_gpu == {0: one} and plan.need_total_by_gpu == {0: 2 * one}
    refused = plan_model(PlacementInput("m", model_path, num_instance=2), {0: 2 * one - 1})
    assert refused.verdict == "refused"
    assert refused.message.startswith(
        f"m 2 replicas need ~{2 * one / GiB:.1f} GiB on GPU 0 ({one / GiB:.1f} each:"
    )


def test_ctx_override_is_honoured_with_a_warning(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path, ctx=30000), {0: 2 * GiB})
    assert plan.verdict == "override" and plan.ok
    assert plan.ctx == 30000 and plan.ctx_per_slot == 30208
    assert plan.rows[0].total == need_at(model_path, 30000)[0]
    assert "override: predicted 3.0 GiB over budget 2.0 GiB on GPU 0" in plan.message
    assert "but GPU 0 has 2.0 GiB" in plan.message and "only a real out-of-memory" in plan.message
    roomy = plan_model(PlacementInput("m", model_path, ctx=4096), {0: 24 * GiB})
    assert roomy.verdict == "override" and "warning" not in roomy.message


def test_gpu_layers_override_offloads_partially_and_picks_a_context(model_path: Path) -> None:
    full = plan_model(PlacementInput("m", model_path), {0: 24 * GiB})
    plan = plan_model(PlacementInput("m", model_path, gpu_layers=8), {0: 24 * GiB})
    assert plan.verdict == "override" and plan.gpu_layers == 8
    assert plan.rows[0].layers == 7  # 7 blocks + the output layer
    assert plan.rows[0].weights < full.rows[0].weights
    assert plan.host_bytes > full.host_bytes
    assert plan.ctx == 32768


def test_unknown_budget_reports_the_prediction(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path, parallel=2), {0: None})
    assert plan.verdict == "unknown-budget" and plan.ok
    # Still a GPU: every layer offloaded, and the context is min(trained, ctx_default) = 4096.
    assert plan.ctx == 4096 and plan.gpu_layers == 17
    assert plan.rows[0].budget is None and plan.rows[0].total == need_at(model_path, 4096, n_seq=2)[0]
    assert "memory of GPU 0 cannot be read" in plan.message and "[devices.N] memory_mib" in plan.message
    bigger = plan_model(PlacementInput("m", model_path, ctx_default=10**6), {0: None})
    assert bigger.ctx == 32768  # never above the trained context
    given = plan_model(PlacementInput("m", model_path, ctx=8192), {})
    assert given.verdict == "unknown-budget" and given.ctx == 8192 and "as configured" in given.message


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    missing = plan_model(PlacementInput("m", tmp_path / "none.gguf"), {0: GiB})
    assert missing.verdict == "error" and "No such file" in missing.message and not missing.ok
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    plan = plan_model(PlacementInput("m", junk), {0: GiB})
    assert plan.verdict == "error" and "not a GGUF file" in plan.message
    assert plan.ctx is None and plan.rows == () and plan.need_by_gpu == {}


def test_multi_gpu_split_follows_budgets(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path, gpus=(0, 2)), {0: 12 * GiB, 1: 1, 2: 4 * GiB})
    assert plan.verdict == "fits"
    a, b = plan.rows
    assert (a.device, b.device) == (0, 2)
    # 17 slots (16 blocks + output) at 3:1: i/17 < 0.75 for blocks 0-12; 13-15 and the output on GPU 2
    assert (a.layers, b.layers) == (13, 3)
    assert set(plan.need_by_gpu) == {0, 2}
    assert plan.tensor_split == (12 * 1024, 4 * 1024)  # MiB, for --tensor-split
    single = plan_model(PlacementInput("m", model_path), {0: 12 * GiB})
    assert single.tensor_split == ()


def test_a_model_without_gpus_runs_on_host_memory(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path, gpus=(), gpu_layers=10), {CPU: 16 * GiB})
    assert plan.verdict == "fits" and plan.gpu_layers == 0
    (row,) = plan.rows
    assert row.device == CPU and row.budget == 16 * GiB
    g = geometry_from_header(read_header(model_path))
    assert row.weights == g.file_weights  # token_embd included
    assert plan.need_by_gpu == {}
    small = plan_model(PlacementInput("m", model_path, gpus=()), {CPU: GiB})
    assert small.verdict == "refused" and small.message.endswith("or free memory")
    assert "on CPU (" in small.message


def test_decide_is_pure_and_deterministic(model_path: Path) -> None:
    g = geometry_from_header(read_header(model_path))
    inp = PlacementInput("m", model_path, parallel=2)
    assert decide(inp, g, {0: 6 * GiB}) == decide(inp, g, {0: 6 * GiB})
    assert hash(decide(inp, g, {0: 6 * GiB})) == hash(decide(inp, g, {0: 6 * GiB}))


def test_plan_document_and_table(model_path: Path, tmp_path: Path) -> None:
    devices = {
        0: DeviceBudget(device=0, name="RTX 3090", total=24 * GiB, available=23 * GiB, reader="nvml"),
        1: DeviceBudget(device=1, declared=200 * MiB),
    }
    inputs = [
        PlacementInput("big", model_path, gpus=(0,), num_instance=2),
        PlacementInput("tiny", model_path, gpus=(1,)),
        PlacementInput("gone", tmp_path / "gone.gguf"),
    ]
    plans = plan_models(inputs, devices)
    doc = plan_document(plans, devices)
    again = json.loads(json.dumps(doc))
    assert again == doc
    assert doc["version"] == 1
    assert [d["id"] for d in doc["devices"]] == [0, 1]
    assert doc["devices"][0]["budget_bytes"] == 23 * GiB and doc["devices"][0]["source"] == "nvml"
    assert doc["devices"][1]["budget_bytes"] == 200 * MiB and doc["devices"][1]["source"] == "config"
    big, tiny, gone = doc["models"]
    assert (big["verdict"], tiny["verdict"], gone["verdict"]) == ("fits", "refused", "error")
    assert big["need_total_by_gpu"]["0"] == 2 * big["need_by_gpu"]["0"]
    row = big["devices"][0]
    assert row["total_bytes"] == sum(
        row[k] for k in ("weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes", "reserve_bytes")
    )
    table = format_plan_table(doc)
    for text in ("RTX 3090", "big", "tiny", "gone", "refused", "error", "x2", "choose a smaller quant"):
        assert text in table


# ----------------------------------------------------------------------------------------- budgets


def test_declared_budget_wins_and_cpu_fallback(tmp_path: Path) -> None:
    found = {0: DeviceBudget(device=0, name="A", total=8 * GiB, available=6 * GiB, reader="nvml")}
    merged = gather_budgets({0: 4096, 1: 2048}, measured=lambda: found)
    assert budget_bytes(merged) == {0: 4 * GiB, 1: 2 * GiB}
    assert merged[0].available == 6 * GiB and merged[0].source == "config"
    more = gather_budgets({0: 10240}, measured=lambda: found)
    assert more[0].budget == 10 * GiB  # declared wins upward too

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:   8192000 kB\n")
    host = host_budget(meminfo)
    assert (host.total, host.available, host.budget, host.source) == (
        16384000 * 1024,
        8192000 * 1024,
        8192000 * 1024,
        "host",
    )
    cpu = gather_budgets({}, host=lambda: host)
    assert list(cpu) == [CPU] and cpu[CPU].budget == 8192000 * 1024
    # Without a reading, nothing is planned on the CPU unless asked for: no GPU is invented either.
    assert gather_budgets({}) == {}


def test_num_gpus_fixes_the_ids() -> None:
    found = {i: DeviceBudget(device=i, total=GiB, available=GiB) for i in range(3)}
    two = gather_budgets({}, num_gpus=2, measured=lambda: found)
    assert list(two) == [0, 1]
    four = gather_budgets({}, num_gpus=4, measured=lambda: found)
    assert budget_bytes(four) == {0: GiB, 1: GiB, 2: GiB, 3: None}
    host = lambda: DeviceBudget(device=CPU, available=5)  # noqa: E731
    none = gather_budgets({}, num_gpus=0, measured=lambda: found, host=host)
    assert budget_bytes(none) == {CPU: 5}


def test_missing_meminfo() -> None:
    host = host_budget(Path("/nonexistent/meminfo"))
    assert host.budget is None and host.source == "unknown"


def test_model_plan_is_frozen(model_path: Path) -> None:
    plan = plan_model(PlacementInput("m", model_path), {0: 24 * GiB})
    assert isinstance(plan, ModelPlan)
    with pytest.raises(AttributeError):
        plan.ctx = 5  # type: ignore[misc]
