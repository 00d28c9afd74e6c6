"""Header-reading benchmark: router.placement.gguf_header.read_header against gguf.GGUFReader.

Writes a synthetic GGUF file shaped like a modern model's header (a 128,256-token vocabulary with scores,
token types and 280,000 merges, plus a few small tensors), then reads it with each reader in its own fresh
subprocess so that the peak RSS (``resource.getrusage(...).ru_maxrss``) of each reader is measured alone.
On Linux a process's ru_maxrss starts from its parent's high-water mark at fork/exec time, so this script
keeps its own process lean: the file is written by another subprocess (the writer needs numpy and holds
the whole vocabulary in memory) and the parent never imports numpy or gguf. VmHWM from /proc (a per-exec
figure) is recorded alongside as a cross-check.
Each subprocess imports its reader, reads the file ``--runs`` times and reports every duration; the table
shows the median, the first (cold) read, the import time and the peak RSS.

Usage::

    python benchmarks/bench_gguf_header.py [--runs 5] [--vocab 128256] [--merges 280000]

Results go to ``outputs/benchmark-gguf-header.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Code run in each child: import the reader, read the file N times, print timings and peak RSS as JSON.
_CHILD = r"""
import json, resource, sys, time
path, runs, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.perf_counter()
if which == "router":
    from router.placement.gguf_header import read_header

    def read():
        h = read_header(path)
        return len(h.tensors), len(h.metadata)
else:
    import gguf

    def read():
        r = gguf.GGUFReader(path)
        return len(r.tensors), len(r.fields)
t_import = time.perf_counter() - t0
times = []
for _ in range(runs):
    t = time.perf_counter()
    result = read()
    times.append(time.perf_counter() - t)
rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
hwm_kib = None
try:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm_kib = int(line.split()[1])
except OSError:
    pass
print(json.dumps({"import_s": t_import, "times_s": times, "peak_rss_kib": rss_kib, "vm_hwm_kib": hwm_kib,
                  "result": result}))
"""


def write_header(path: Path, n_vocab: int, n_merges: int) -> None:
    """A GGUF file with a large tokenizer and a few tiny tensors."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(131072)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list([f"tok_{i:06d}\u0120x" for i in range(n_vocab)])
    w.add_token_scores([float(-i) for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges([f"m{i % 977} n{i}" for i in range(n_merges)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((8, 64), dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
        w.add_tensor(
            f"blk.{i}.attn_q.weight", rng.standard_normal((64, 64), dtype=np.float32).astype(np.float16)
        )
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_header_in_subprocess(path: Path, n_vocab: int, n_merges: int) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[4]); from bench_gguf_header import write_header; "
        "from pathlib import Path; write_header(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
    )
    here = str(Path(__file__).resolve().parent)
    subprocess.run([sys.executable, "-c", code, str(path), str(n_vocab), str(n_merges), here], check=True)


def run_child(path: Path, which: str, runs: int) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(runs), which],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT,
    )
    data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--merges", type=int, default=280000)
    ap.add_argument("--output", type=Path, default=ROOT / "outputs" / "benchmark-gguf-header.json")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        path = Path(tmp) / "header.gguf"
        write_header_in_subprocess(path, args.vocab, args.merges)
        size = path.stat().st_size
        rows = {}
        for which in ("router", "gguf.GGUFReader"):
            data = run_child(path, "router" if which == "router" else "gguf", args.runs)
            times = data["times_s"]
            rows[which] = {
                "median_ms": statistics.median(times) * 1000,
                "first_ms": times[0] * 1000,
                "min_ms": min(times) * 1000,
                "import_ms": data["import_s"] * 1000,
                "peak_rss_mib": data["peak_rss_kib"] / 1024,
                "vm_hwm_mib": data["vm_hwm_kib"] / 1024 if data.get("vm_hwm_kib") else None,
                "runs": len(times),
            }

    ours, theirs = rows["router"], rows["gguf.GGUFReader"]
    result = {
        "benchmark": "gguf-header",
        "file_bytes": size,
        "vocab": args.vocab,
        "merges": args.merges,
        "python": sys.version.split()[0],
        "readers": rows,
        "speedup_median": theirs["median_ms"] / ours["median_ms"] if ours["median_ms"] else None,
        "rss_ratio": theirs["peak_rss_mib"] / ours["peak_rss_mib"] if ours["peak_rss_mib"] else None,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")

    print(f"header file: {size / 2**20:.1f} MiB, vocab {args.vocab}, merges {args.merges}, runs {args.runs}")
    print(f"{'reader':<18}{'median ms':>11}{'first ms':>10}{'import ms':>11}{'peak RSS MiB':>14}")
    for name, row in rows.items():
        print(
            f"{name:<18}{row['median_ms']:>11.1f}{row['first_ms']:>10.1f}{row['import_ms']:>11.1f}"
            f"{row['peak_rss_mib']:>14.1f}"
        )
    print(f"speed-up {result['speedup_median']:.0f}x, RSS ratio {result['rss_ratio']:.1f}x -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
