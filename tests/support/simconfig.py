"""The configuration document of a router whose models are simulated llama-servers.

``config_document(dir, models, ...)`` turns test-sized model tables into a full document: every model gets
a simulated model file under ``dir/models`` (JSON, or a header-only GGUF when the table names a
``shape``), the router listens on a free port and runs the simulator in place of llama-server, and its
history and replica logs stay under ``dir``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from router.placement.synthetic import SyntheticModel
from router.shell.ports import free_port
from tests.support.simtools import sim_launcher, write_sim_gguf, write_sim_model

# Fast defaults for the simulator: quick loads, tokens at a steady 50 per second.
SIM_DEFAULTS: Mapping[str, Any] = {"load_delay": 0.1, "tokens": 8, "token_rate": 50.0}


def config_document(
    dir: Path,
    models: Mapping[str, Mapping[str, Any]],
    *,
    router: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    pools: Mapping[str, Any] | None = None,
    port: int | None = None,
    peers: Mapping[str, Any] | None = None,
    rpc_devices: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The configuration document for simulated ``models``.

    Each value of ``models`` is a ``[models.NAME]`` table, except that its ``sim`` key (a dict of behaviour
    keys) describes the simulated model and its ``shape`` key (a :class:`SyntheticModel`), when present,
    makes the file a header-only GGUF of that shape (placement reads it) instead of a JSON file; ``model``
    is filled in with the file written for it. Every simulated model records its start (argv, env) under
    ``dir/records/NAME`` unless ``sim`` says otherwise.
    """
    records = dir / "records"
    tables: dict[str, Any] = {}
    for name, raw in models.items():
        table = dict(raw)
        behaviour = {**SIM_DEFAULTS, "record_dir": records / name, **table.pop("sim", {})}
        shape = table.pop("shape", None)
        if "model" not in table:  # a given file (a GGUF with a sidecar, say) is used as it is
            table["model"] = str(_model_file(dir / "models", name, shape, behaviour))
        tables[name] = table
    router_table: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port if port is not None else free_port(),
        "llama_server": str(sim_launcher(dir)),
        "history_db": str(dir / "history.db"),
        "load_timeout": 20.0,
        "stop_timeout": 3.0,
        "shutdown_grace": 10.0,
        "replica_logs": str(dir / "replica-logs"),
        "kv_store_dir": str(dir / "kv"),
        **(router or {}),
    }
    doc: dict[str, Any] = {"router": router_table, "models": tables}
    if devices:
        doc["devices"] = dict(devices)
    if defaults:
        doc["defaults"] = dict(defaults)
    if pools:
        doc["pools"] = dict(pools)
    if peers:
        doc["peers"] = dict(peers)
    if rpc_devices:
        doc["rpc_devices"] = dict(rpc_devices)
    return doc


def _model_file(dir: Path, name: str, shape: SyntheticModel | None, behaviour: Mapping[str, Any]) -> Path:
    if shape is None:
        return write_sim_model(dir, name, **behaviour)
    return write_sim_gguf(dir, name, shape, name=name, **behaviour)


def with_replica_logs(dir: Path, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``router.replica_logs`` and ``router.kv_store_dir`` under ``dir`` when it names none
    (tests never write to the user's state directory)."""
    router = dict(doc.get("router") or {})
    router.setdefault("replica_logs", str(dir / "replica-logs"))
    router.setdefault("kv_store_dir", str(dir / "kv"))
    return {**doc, "router": router}


def write_config(dir: Path, doc: Mapping[str, Any]) -> Path:
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / "router.json"
    path.write_text(json.dumps(doc, indent=1))
    return path
