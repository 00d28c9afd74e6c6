"""Compare the router's memory plan with what llama-server really takes on an NVIDIA GPU.

Run it through ``scripts/gpu-calibrate``. Steps:

1. build a CUDA llama-server from the same sdist as the CPU one (``LLAMA_ROUTER_CUDA=1
   scripts/install-llama-server``; skipped with ``--llama-server PATH``);
2. write two random-weight models with the layer shapes of real ones (kept for later runs in
   ``calibration-models/`` of the router's home, ``~/.cache/llama-router`` by default);
3. start ``python -m router`` with both on GPU 0 (one with the automatic context and two slots, one with an
   operator ``ctx``), load each with one chat request, and compare, per replica, the plan's prediction for
   GPU 0 with llama-server's own logged CUDA0 buffer sizes and with the memory nvidia-smi reports for the
   replica's process (and the rise of the GPU's used memory during its load); then ``POST /reload`` with
   both resident and check that the contexts stay the same;
4. print tables and write ``outputs/gpu-calibration.json``.

Exit status: 0 when every check passed, 1 when a check failed or the run broke, 2 when this machine cannot
run it (no nvidia-smi, no GPU, no nvcc to build with). ``--cpu-dry-run`` runs steps 2-4 with the CPU
build and its CPU buffers instead, so the script itself can be checked on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from router.hosts.locate import INSTALL_COMMAND, LlamaServerNotFound, find_llama_server, router_home  # noqa: E402
from scripts.calibrate.errors import Unavailable  # noqa: E402
from scripts.calibrate.machine import build_cuda_server, preflight_gpu  # noqa: E402
from scripts.calibrate.report import report, write_document  # noqa: E402
from scripts.calibrate.run import calibrate  # noqa: E402
from scripts.calibrate.subjects import REAL_SUBJECTS, SMALL_SUBJECTS  # noqa: E402

OUTPUT = ROOT / "outputs" / "gpu-calibration.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-calibrate",
        description="Compare the router's memory plan with what llama-server takes on GPU 0 (CUDA).",
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="use the CPU build and its CPU buffers (no GPU needed; nvidia-smi columns stay empty)",
    )
    parser.add_argument("--llama-server", type=Path, help="use this llama-server instead of building one")
    parser.add_argument(
        "--small-models", action="store_true", help="tiny widths instead of the real shapes (a quick check)"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=router_home() / "calibration-models",
        help="where the generated models are kept between runs (default: %(default)s)",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help="JSON result (default: %(default)s)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (config, router and replica logs)"
    )
    return parser


@contextlib.contextmanager
def stop_on_signals(received: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM end the run through the normal clean-up, which stops the router and its replicas.

    Each signal is noted in ``received``: Ctrl-C in a terminal reaches the router too, and what it refuses
    while it drains is then part of the interruption, not a failure.
    """

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    subjects = SMALL_SUBJECTS if args.small_models else REAL_SUBJECTS
    received: list[int] = []
    try:
        with stop_on_signals(received):
            if args.cpu_dry_run:
                binary = find_llama_server(str(args.llama_server) if args.llama_server else None)
            else:
                preflight_gpu(build=args.llama_server is None)
                binary = args.llama_server or build_cuda_server()
            document = calibrate(args, binary, subjects)
    except (Unavailable, LlamaServerNotFound) as exc:
        hint = f" (the CPU build: {INSTALL_COMMAND})" if isinstance(exc, LlamaServerNotFound) else ""
        print(f"gpu-calibrate: cannot run here: {exc}{hint}", file=sys.stderr)
        return 2
    except (RuntimeError, httpx.HTTPError, OSError, KeyboardInterrupt) as exc:
        if received or isinstance(exc, KeyboardInterrupt):
            signum = received[0] if received else signal.SIGINT
            name = signal.Signals(signum).name
            print(f"gpu-calibrate: stopped by {name}; the router and its replicas are gone", file=sys.stderr)
            return 128 + signum
        print(f"gpu-calibrate: failed: {exc}", file=sys.stderr)
        return 1
    report(document)
    write_document(args.output, document)
    print(f"wrote {args.output}")
    print("all checks passed" if document["ok"] else "some checks FAILED")
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
