"""What a simulated model does (:class:`Behaviour`), read from the model file: the JSON document itself,
or for a GGUF file the JSON sidecar ``MODEL.gguf.sim.json`` next to it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the simulated model does; every field is an optional key of the model's JSON file."""

    name: str | None = None
    load_delay: float = 0.2
    tokens: int = 16
    token_rate: float | None = 50.0
    prompt_rate: float | None = None
    crash_after_tokens: int | None = None
    oom_at_load: bool = False
    oom_mib: float = 4096.0
    exit_at_load: int | None = None
    hang_health: bool = False
    ignore_sigterm: bool = False
    record_dir: str | None = None
    embedding_dim: int = 8
    reply: str | None = None
    n_ctx_train: int = 4096
    model_mib: float = 64.0
    # MiB this replica "holds" on each GPU it is shown, reported to a stand-in NVML through the file
    # $FAKE_NVML_PROCS_DIR/<pid> once loaded (None: report nothing).
    gpu_mib: float | None = None
    web_ui: bool = False
    slot_save_delay: float = 0.0  # seconds a slot save or restore takes


BEHAVIOUR_KEYS: frozenset[str] = frozenset(f.name for f in fields(Behaviour))
SIDECAR_SUFFIX = ".sim.json"
JSON_HEAD = 64 * 1024  # the most of a JSON model file read for its behaviour


def load_behaviour(model_path: str) -> Behaviour:
    """The behaviour for a model file: the JSON object it starts with (whitespace may follow, as much as it
    likes); for a GGUF file, the JSON sidecar ``MODEL.gguf.sim.json`` when present, else the defaults.
    Raises OSError or ValueError when unusable."""
    with open(model_path, "rb") as f:
        head = f.read(4)
        if head == b"GGUF":
            sidecar = model_path + SIDECAR_SUFFIX
            if not os.path.exists(sidecar):
                return Behaviour()
            with open(sidecar, "rb") as g:
                raw = g.read()
        else:
            raw = head + f.read(JSON_HEAD)
    # A model file padded to weigh something (see simserver.main._read_weights) holds its JSON object first:
    # only that is read here, so that what the process reads of the file stays what its load reads.
    data, _ = json.JSONDecoder().raw_decode((raw or b"{}").decode())
    if not isinstance(data, dict):
        raise ValueError("the model file must hold a JSON object")
    unknown = sorted(set(data) - BEHAVIOUR_KEYS)
    if unknown:
        raise ValueError(f"unknown behaviour keys: {', '.join(unknown)}")
    return Behaviour(**data)
