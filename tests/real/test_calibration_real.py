"""The footprint arithmetic against what the real llama-server allocates.

Each case writes a tiny random-weight llama model, starts llama-server on it (CPU only, ``--fit off
-ngl 0``) with a context, a slot count and KV cache types, and reads the buffer sizes it logs at load:

    load_tensors:   CPU_Mapped model buffer size =    15.91 MiB
    llama_kv_cache:        CPU KV buffer size =     0.50 MiB
    sched_reserve:        CPU compute buffer size =     3.14 MiB

and compares them with :func:`router.placement.footprint.estimate` for the ``"cpu"`` device: weights and
KV within 2%, weights + KV + compute within 10%, and the compute buffer alone within 3% (10% for toy
shapes whose feed-forward is narrower than 2.5 x n_embd).

Apples to apples: on a GPU, ``token_embd`` stays in host memory and placement leaves it out of the GPU's
weights; on this CPU-only build every tensor, ``token_embd`` included, is in the one CPU model buffer, so the
comparison uses the ``"cpu"`` device, whose weights are all the file's tensors (a tied output shares the
input's copy there, as llama.cpp does with a memory-mapped CPU buffer). The CPU "output buffer" (host
logits, a few hundred KiB) and the per-device reserve are on neither side. The layer arithmetic (which
tensors and KV rows a layer holds, how the context is padded and split into slots) is the same one GPU
placement uses; only the device the bytes land on differs.
"""

from __future__ import annotations

import re

import attrs
import pytest

from router.cli.tinymodel import TinyShape
from router.placement.footprint import CPU, estimate
from router.placement.geometry import geometry_from_header
from router.placement.gguf_header import read_header
from tests.support.realenv import require_llama_server, running_llama_server, tiny_model

pytestmark = pytest.mark.real

MiB = 1 << 20
BUFFER_RE = re.compile(r"\b(\S+)\s+(model|KV|RS|compute) buffer size\s*=\s*([0-9.]+) MiB")


@attrs.frozen
class Case:
    shape: TinyShape
    ctx: int
    slots: int
    cache_k: str = "f16"
    cache_v: str = "f16"
    flash_attn: bool = True
    ubatch: int = 512

    def args(self) -> list[str]:
        return [
            *("--cache-type-k", self.cache_k, "--cache-type-v", self.cache_v),
            *("--flash-attn", "on" if self.flash_attn else "off"),
            *("--ubatch-size", str(self.ubatch), "--no-warmup", "--log-verbosity", "4"),
        ]


CASES = {
    # f32 weights, GQA 2:1, head size 16
    "f32-gqa2-f16kv": Case(TinyShape(), ctx=2048, slots=1),
    # f16 weights, GQA 4:1, head size 32, q8_0 K and V, 2 slots
    "f16-gqa4-q8kv": Case(
        TinyShape(n_embd=256, n_head=8, n_head_kv=2, n_ff=768, dtype="f16"),
        ctx=4096,
        slots=2,
        cache_k="q8_0",
        cache_v="q8_0",
    ),
    # no GQA, head size 32, q4_0 K and V, 3 slots: 3000 -> 3072 cells, 1024 per slot
    "f16-mha-q4kv-3slots": Case(
        TinyShape(n_embd=128, n_head=4, n_head_kv=4, n_ff=384, dtype="f16"),
        ctx=3000,
        slots=3,
        cache_k="q4_0",
        cache_v="q4_0",
    ),
    # tied output, GQA 4:1, no flash attention (score matrix in the compute buffer), 4 slots
    "f32-tied-nofa-4slots": Case(
        TinyShape(n_embd=64, n_head=4, n_head_kv=1, n_ff=192, tie_output=True),
        ctx=4096,
        slots=4,
        flash_attn=False,
    ),
    # head size 64, q8_0 K with f16 V, no flash attention, larger context
    "f16-hd64-q8k-nofa": Case(
        TinyShape(n_embd=256, n_head=4, n_head_kv=2, n_ff=768, dtype="f16"),
        ctx=8192,
        slots=1,
        cache_k="q8_0",
        flash_attn=False,
    ),
    # wider model, smaller micro-batch
    "f16-e512-ub256": Case(
        TinyShape(n_embd=512, n_head=8, n_head_kv=8, n_ff=1536, dtype="f16"),
        ctx=2048,
        slots=1,
        ubatch=256,
    ),
}


def logged_buffers(log: str) -> dict[str, float]:
    """MiB per buffer kind (model, KV, RS, compute), summed over the devices/buffer types logged."""
    sizes: dict[str, float] = {}
    for _device, kind, mib in BUFFER_RE.findall(log):
        sizes[kind] = sizes.get(kind, 0.0) + float(mib)
    return sizes


def within(estimated: float, logged: float, tolerance: float, what: str) -> None:
    # The log rounds to 0.01 MiB; allow that on top of the relative tolerance.
    error = abs(estimated - logged) - 0.005
    assert error <= tolerance * logged, (
        f"{what}: estimated {estimated:.3f} MiB, llama-server logged {logged:.3f} MiB "
        f"({100 * (estimated - logged) / logged:+.1f}%, tolerance {100 * tolerance:.0f}%)"
    )


@pytest.mark.parametrize("name", list(CASES))
def test_estimate_matches_llama_server(name: str) -> None:
    require_llama_server()
    case = CASES[name]
    path = tiny_model(case.shape)
    geometry = geometry_from_header(read_header(path))
    fp = estimate(
        geometry,
        (CPU,),
        ctx=case.ctx,
        n_seq=case.slots,
        cache_type_k=case.cache_k,
        cache_type_v=case.cache_v,
        ubatch=case.ubatch,
        flash_attn=case.flash_attn,
    )
    (row,) = fp.devices
    with running_llama_server(path, *case.args(), ctx=case.ctx, slots=case.slots) as server:
        log = server.log_text()
    got = logged_buffers(log)
    assert {"model", "KV", "compute"} <= set(got), f"buffer sizes missing from the log:\n{log[-3000:]}"
    # The context llama.cpp really allocated is the one we predicted.
    assert f"n_ctx                 = {fp.layout.n_ctx}" in log
    assert f"n_ctx_seq             = {fp.layout.n_ctx_seq}" in log

    est = {
        "model": row.weights / MiB,
        "KV": row.kv / MiB,
        "compute": row.compute / MiB,
    }
    logged_total = got["model"] + got["KV"] + got.get("RS", 0.0) + got["compute"]
    est_total = (row.weights + row.kv + row.recurrent + row.compute) / MiB

    def pct(a: float, b: float) -> str:
        return f"{100 * (a - b) / b:+.1f}%"

    figures = [f"{k} {est[k]:.2f}/{got[k]:.2f} MiB ({pct(est[k], got[k])})" for k in est]
    figures.append(f"total {est_total:.2f}/{logged_total:.2f} MiB ({pct(est_total, logged_total)})")
    print(f"\n{name} (estimate/logged): " + ", ".join(figures))
    within(est["model"], got["model"], 0.02, "weights")
    within(est["KV"], got["KV"], 0.02, "KV cache")
    within(est_total, logged_total, 0.10, "weights + KV + compute")
    # The compute formula itself: tight where the feed-forward phase dominates (real models have
    # n_ff >= 2.5 n_embd), looser on toy shapes where overlapping short-lived tensors decide the peak.
    realistic = case.shape.n_ff >= 2.5 * case.shape.n_embd
    within(est["compute"], got["compute"], 0.03 if realistic else 0.10, "compute buffer")
