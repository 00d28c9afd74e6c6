"""RPC devices as the scheduler and placement see them: device ids, budgets, order and exclusivity.

Each ``[rpc_devices.NAME]`` becomes one scheduler device with id ``RPC_BASE + i`` (``i`` its position in the
file), far above any local GPU id, so the residency cap, budgets, ``fits`` and eviction treat it exactly like
a GPU. Only local GPUs are ever masked for a replica (``local_gpus``): RPC ids never reach
``CUDA_VISIBLE_DEVICES``.

Device order. llama.cpp puts RPC devices first, in the order of ``--rpc``, then the local GPUs (src/llama.cpp,
``llama_model_load``: "add RPC servers at the front of the list"). ``--tensor-split`` and placement's layer
split follow that order: :func:`model_devices` lists a model's RPC ids (in its ``rpc`` order) before its GPUs.

Exclusivity. An rpc-server serves one client at a time (``ggml_backend_rpc_start_server`` accepts the next
connection only once the current client has gone), and a llama-server keeps its connection for as long as
its model is loaded. A second replica on the same device would wait for the first to exit. So the scheduler
reserves an RPC device's whole budget for each replica on it (:func:`exclusive_need`): two replicas can
never hold one RPC device at once, whatever ``max_models_per_gpu`` says, and a model that needs the device
evicts the one holding it. The plan keeps the predicted share for the dashboard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from router.config.values import Config, ModelConfig

__all__ = [
    "RPC_BASE",
    "RpcDevice",
    "exclusive_need",
    "is_rpc",
    "local_gpus",
    "model_devices",
    "model_rpc_ids",
    "rpc_argv",
    "rpc_devices",
]

RPC_BASE = 1000
MiB = 1 << 20


@attrs.frozen
class RpcDevice:
    """One RPC device: its name and endpoint from the file, its scheduler id and budget in bytes."""

    name: str
    endpoint: str
    host: str
    port: int
    id: int
    budget: int

    @property
    def label(self) -> str:
        return f"RPC {self.name} ({self.endpoint})"


def is_rpc(device: int) -> bool:
    """Whether a scheduler device id stands for an RPC device."""
    return device >= RPC_BASE


def local_gpus(devices: Iterable[int]) -> tuple[int, ...]:
    """The local GPU ids among scheduler device ids (what may be masked for a replica)."""
    return tuple(d for d in devices if not is_rpc(d))


def rpc_devices(config: Config) -> tuple[RpcDevice, ...]:
    """Every configured RPC device, in file order, with its scheduler id."""
    return tuple(
        RpcDevice(d.name, d.endpoint, d.host, d.port, RPC_BASE + i, d.memory_mib * MiB)
        for i, d in enumerate(config.rpc_devices.values())
    )


def _by_name(config: Config) -> dict[str, RpcDevice]:
    return {d.name: d for d in rpc_devices(config)}


def model_rpc_ids(config: Config, model: ModelConfig) -> tuple[int, ...]:
    """The scheduler ids of a model's RPC devices, in its ``rpc`` order (llama.cpp's order)."""
    by_name = _by_name(config)
    return tuple(by_name[name].id for name in model.rpc)


def model_devices(config: Config, model: ModelConfig, gpus: Sequence[int]) -> tuple[int, ...]:
    """All devices of a model in llama.cpp's order: its RPC devices, then its local GPUs."""
    return (*model_rpc_ids(config, model), *gpus)


def rpc_argv(config: Config, model: ModelConfig) -> tuple[str, ...]:
    """``--rpc host:port,...`` for a model with RPC devices (nothing for one without)."""
    if not model.rpc:
        return ()
    return ("--rpc", ",".join(config.rpc_devices[name].endpoint for name in model.rpc))


def exclusive_need(
    need: Mapping[int, int], devices: Iterable[int], budgets: Mapping[int, int | None]
) -> dict[int, int]:
    """``need`` with the share of every RPC device among ``devices`` raised to the device's whole budget
    (see the module doc); also where placement predicted nothing."""
    out = dict(need)
    for device in devices:
        budget = budgets.get(device)
        if is_rpc(device) and budget is not None:
            out[device] = max(out.get(device, 0), budget)
    return out
