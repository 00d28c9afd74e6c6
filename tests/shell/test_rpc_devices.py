"""RPC devices in the running router, against simulated llama-servers: the replica's command line and mask,
swaps on one RPC device, and the ``rpc_devices`` section of /status with each device's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from router.deploy.rpc_devices import RPC_BASE
from router.shell.ports import free_port
from tests.support.client import post_chat
from tests.support.harness import serving
from tests.support.simconfig import config_document
from tests.support.simtools import read_records
from tests.support.waiting import until


async def _status_until(handle: Any, ready: Any, timeout: float = 10.0) -> dict[str, Any]:
    async def doc() -> dict[str, Any] | None:
        got = await handle.status()
        return dict(got) if ready(got) else None

    return await until(doc, timeout=timeout, what="/status condition")


async def test_a_model_on_rpc_devices_starts_with_rpc_and_status_shows_the_devices(tmp_path: Path) -> None:
    # A listener on loopback stands in for an rpc-server; the second endpoint has nothing behind it.
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    down = free_port()
    models = {
        "remote": {"gpus": [], "rpc": ["box"], "sim": {}},
        "other": {"gpus": [], "rpc": ["box"], "sim": {}},
        "local": {"gpus": [0], "sim": {}},
    }
    doc = config_document(tmp_path, models, router={"num_gpus": 1, "max_models_per_gpu": 2})
    doc["rpc_devices"] = {
        "box": {"endpoint": f"127.0.0.1:{port}", "memory_mib": 2048},
        "gone": {"endpoint": f"127.0.0.1:{down}", "memory_mib": 1024},
    }

    async def accept_and_close() -> None:
        while True:
            stream = await listener.accept()
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_and_close)
        async with serving(tmp_path, doc) as h:
            status = await _status_until(h, lambda d: all(r["state"] != "unknown" for r in d["rpc_devices"]))
            entries = {d["name"]: d for d in status["rpc_devices"]}
            assert entries["box"]["state"] == "reachable" and entries["box"]["probe"]["reachable"]
            assert entries["gone"]["state"] == "unreachable" and entries["gone"]["probe"]["error"]
            assert entries["box"]["id"] == RPC_BASE and entries["gone"]["id"] == RPC_BASE + 1
            assert entries["box"]["budget_bytes"] == 2048 << 20
            assert entries["box"]["models"] == ["remote", "other"]
            assert [g["id"] for g in status["gpus"]] == [0]  # RPC devices are no GPUs

            assert (await post_chat(h.client, "remote", max_tokens=1)).status_code == 200
            (record,) = read_records(h.records_of("remote"))
            argv = record["argv"]
            assert argv[argv.index("--rpc") + 1] == f"127.0.0.1:{port}"
            assert record["env"]["CUDA_VISIBLE_DEVICES"] == ""

            status = await h.status()
            box = next(d for d in status["rpc_devices"] if d["name"] == "box")
            assert box["state"] == "in_use" and box["residents"] == ["remote"]
            assert box["reserved_bytes"] == 2048 << 20
            assert [r["model"] for r in box["replicas"]] == ["remote"]
            (replica,) = status["replicas"]
            assert replica["gpus"] == [] and replica["rpc_devices"] == ["box"]

            # The other model on the same device evicts the first, though the cap would allow two.
            assert (await post_chat(h.client, "other", max_tokens=1)).status_code == 200
            status = await h.status()
            box = next(d for d in status["rpc_devices"] if d["name"] == "box")
            assert box["residents"] == ["other"]
            kinds = [(e["kind"], e["model"]) for e in status["recent"]]
            assert ("stop", "remote") in kinds or ("exited", "remote") in kinds, kinds

            page = await h.client.get("/dash/dash-rpc.js")
            assert page.status_code == 200 and "rpc_devices" in page.text
        nursery.cancel_scope.cancel()
