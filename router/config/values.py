"""The frozen values a loaded configuration consists of, and the error a bad configuration raises.

All values are immutable and hashable. Tables keyed by name keep the order of the file (models start in
that order; flags reach llama-server in that order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from router.config.keyspec import spec_by_name
from router.config.schema import ROUTER_KEYS
from router.frozenmap import FrozenMap

# The value of ModelConfig.gpus that stands for every GPU the router sees; resolve with resolve_gpus().
ALL_GPUS: Literal["all"] = "all"
# The value of ModelConfig.gpus that lets the scheduler choose the GPUs at each load (among every GPU the
# router sees; resolve_gpus() gives them).
ANY_GPUS: Literal["any"] = "any"

GpuSelection = tuple[int, ...] | Literal["all", "any"]
"""A sorted tuple of distinct GPU ids (empty: the CPU), or the string "all" or "any"."""

FlagScalar = str | int | float | bool
FlagValue = FlagScalar | tuple[str | int | float, ...]
"""A llama-server flag value: true → bare flag, false → left out, tuple → the flag repeated per item."""


def _frozen_map(value: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> FrozenMap[Any, Any]:
    return value if isinstance(value, FrozenMap) else FrozenMap(value)


class ConfigError(Exception):
    """A configuration problem. The message names the file, the dotted key, the bad value and the rule.

    ``path`` is the file (or the name given to config_from_dict); ``key`` the dotted key or environment
    variable (None for problems with the file as a whole); ``detail`` the text after the file name.
    """

    def __init__(self, path: str | Path, detail: str, *, key: str | None = None) -> None:
        super().__init__(f"config error in {path}: {detail}")
        self.path = str(path)
        self.key = key
        self.detail = detail


@attrs.frozen
class Pricing:
    """Prices in dollars per million tokens, shown in /v1/models. None: not stated."""

    input: float | None = None
    cached_input: float | None = None
    output: float | None = None


@attrs.frozen
class ReasoningEffort:
    """Reasoning effort levels a model offers, shown in /v1/models. ``disable``: the level a client sends
    to turn reasoning off (None: not offered)."""

    options: tuple[str, ...]
    default: str | None = None
    disable: str | None = None


@attrs.frozen
class DeviceConfig:
    """``[devices.N]``: a declared memory budget in MiB (None: use what the GPU reports)."""

    memory_mib: int | None = None


@attrs.frozen
class RpcDeviceConfig:
    """``[rpc_devices.NAME]``: a device another machine exposes through llama.cpp's rpc-server.

    ``endpoint`` is written as in the file (``host:port``), ``host`` and ``port`` are its parts (an IPv6
    host without brackets); ``memory_mib`` is the declared memory placement plans on.
    """

    name: str
    endpoint: str
    host: str
    port: int
    memory_mib: int


def _tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


def _map_or_empty(value: Mapping[str, Any] | None) -> FrozenMap[str, Any]:
    return FrozenMap() if value is None else _frozen_map(value)


def _tuple_or_empty(value: Iterable[Any] | None) -> tuple[Any, ...]:
    return () if value is None else tuple(value)


def _gpus(value: GpuSelection | Iterable[int]) -> GpuSelection:
    if value in (ALL_GPUS, ANY_GPUS):
        return value  # type: ignore[return-value]
    assert not isinstance(value, str)
    return tuple(sorted(set(value)))


@attrs.frozen
class ModelConfig:
    """``[models.NAME]``.

    ``path`` is the GGUF file (the ``model`` key). ``gpus`` is a sorted tuple of distinct ids,
    :data:`ALL_GPUS` or :data:`ANY_GPUS` (``gpus_max`` and ``spread`` shape the scheduler's choice then);
    ``rpc`` names ``[rpc_devices.NAME]`` tables in the order written. ``ctx`` None means automatic;
    ``gpu_layers`` None means placement's choice;
    ``ttl`` None means never unloaded for idleness; ``cram`` (MiB of host-memory prompt cache per
    replica, ``[defaults]`` already applied) None means sized by placement. ``gpus_named`` says whether the
    table, ``[defaults]`` or ``num_gpus`` chose ``gpus`` (see ``router.deploy.cpu_host``). ``extra_args``
    holds every other key of the table as (key as written, value) pairs in file order: llama-server flags,
    rendered by ``router.config.llama_args``. ``llama_server`` is the model's own binary as written (a path
    made absolute from the config file's directory, or a bare name for PATH; None: the router's); ``env``
    the variables added to its replicas' environment; ``set_params`` (frozen JSON values) and
    ``strip_params`` the request body fields forced and removed (``router.http.body_filters``). ``[defaults]``
    is already applied to all four.
    """

    name: str
    path: Path
    gpus: GpuSelection = attrs.field(default=(0,), converter=_gpus)
    rpc: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    num_instance: int = 1
    parallel: int = 1
    ctx: int | None = None
    gpu_layers: int | None = None
    cram: int | None = None
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    pinned: bool = False
    ttl: float | None = None
    load_on_startup: bool = False
    kv_store: bool = True
    pricing: Pricing | None = None
    reasoning_effort: ReasoningEffort | None = None
    extra_args: tuple[tuple[str, FlagValue], ...] = attrs.field(default=(), converter=_tuple)
    gpus_max: int | None = None
    spread: bool = True
    gpus_named: bool = True  # False: gpus is the default, set by nobody (a host without GPUs moves it)
    llama_server: str | None = None
    env: FrozenMap[str, str] = attrs.field(factory=FrozenMap, converter=_map_or_empty)
    set_params: FrozenMap[str, Any] = attrs.field(factory=FrozenMap, converter=_map_or_empty)
    strip_params: tuple[str, ...] = attrs.field(default=(), converter=_tuple_or_empty)

    @property
    def filters_body(self) -> bool:
        """Whether requests to this model have body fields set or stripped (else they pass byte for byte)."""
        return bool(self.set_params or self.strip_params)


@attrs.frozen
class PoolConfig:
    """``[pools.NAME]``: member model names in priority order."""

    name: str
    members: tuple[str, ...] = attrs.field(converter=_tuple)
    fallback: bool = False
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple)


@attrs.frozen
class PeerConfig:
    """``[peers.NAME]``: another router that serves models here over HTTP. ``url`` has no trailing slash;
    ``api_key`` holds the key (from the file too, when ``api_key_file`` is set); ``models`` empty means
    discovered; ``max_in_flight`` None means advertised by the peer, else the default."""

    name: str
    url: str
    api_key: str | None = None
    api_key_file: Path | None = None
    models: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    max_in_flight: int | None = None
    refresh: float = 30.0
    connect_timeout: float = 5.0


@attrs.frozen
class KeyConfig:
    """``[keys.NAME]``: a named client. ``secret`` is the key it presents (from ``key``, the variable
    ``key_env`` or the file ``key_file``), kept out of ``repr``; ``klass`` its class label
    (``router.config.key_specs.CLASSES``); ``models`` its globs over model, pool and alias names (None:
    everything). ``max_queued`` goes to the scheduler (``Settings.max_queued``); the two limits over time
    are kept by ``router.shell.quota``."""

    name: str
    secret: str = attrs.field(repr=False)
    klass: str = "standard"
    weight: int = 1
    models: tuple[str, ...] | None = None
    admin: bool = False
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_queued: int | None = None
    key_env: str | None = None
    key_file: Path | None = None

    @property
    def secret_key(self) -> str:
        """The key of the table the secret came from (``key``, ``key_env`` or ``key_file``)."""
        return "key_env" if self.key_env is not None else "key_file" if self.key_file is not None else "key"


def _router_default(name: str) -> Any:
    return spec_by_name(ROUTER_KEYS, name).default


@attrs.frozen
class RouterSettings:
    """``[router]`` after environment overrides; defaults equal the schema's (router.config.schema).

    ``api_keys`` holds the keys from the file or ROUTER_API_KEYS; the keys in ``api_keys_file`` are read
    by ``router.config.load.read_api_keys``. ``cors_origins`` and ``allowed_hosts`` are in canonical form
    (lower case; origins without a default port), as ``router.http.browser_guard`` compares them.
    ``history_db``, ``replica_logs`` and ``kv_store_dir`` are always concrete paths.
    """

    host: str = _router_default("host")
    port: int = _router_default("port")
    llama_server: str | None = None
    max_models_per_gpu: int = _router_default("max_models_per_gpu")
    eviction: str = _router_default("eviction")
    preload: tuple[str, ...] = attrs.field(default=_router_default("preload"), converter=_tuple)
    ttl: float | None = _router_default("ttl")
    max_keep_alive: float | None = _router_default("max_keep_alive")
    swap_batch_max: int = _router_default("swap_batch_max")
    swap_batch_window: float = _router_default("swap_batch_window")
    swap_hold: float | None = _router_default("swap_hold")
    min_residency: float = _router_default("min_residency")
    queue_head_grace: float | None = _router_default("queue_head_grace")
    queue_force_load_timeout: float = _router_default("queue_force_load_timeout")
    queue_limit: int = _router_default("queue_limit")
    routing_queue_limit: int = _router_default("routing_queue_limit")
    max_wait_interactive: float = _router_default("max_wait_interactive")
    max_wait_standard: float = _router_default("max_wait_standard")
    max_wait_batch: float = _router_default("max_wait_batch")
    affinity_guard: int = _router_default("affinity_guard")
    prefix_affinity: bool = _router_default("prefix_affinity")
    num_gpus: int | None = None
    load_timeout: float = _router_default("load_timeout")
    hang_timeout: float = _router_default("hang_timeout")
    reply_timeout: float = _router_default("reply_timeout")
    stop_timeout: float = _router_default("stop_timeout")
    shutdown_grace: float = _router_default("shutdown_grace")
    max_body_mib: int = _router_default("max_body_mib")
    keep_alive_timeout: float = _router_default("keep_alive_timeout")
    send_timeout: float = _router_default("send_timeout")
    max_connections: int | None = None
    default_pool: str | None = None
    api_keys: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    cors_origins: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    api_keys_file: Path | None = None
    history_db: Path = Path("history.db")
    history_max_rows: int = _router_default("history_max_rows")
    history_max_age_days: float = _router_default("history_max_age_days")
    gpu_reserve_mib: int = _router_default("gpu_reserve_mib")
    allow_public_rpc: bool = _router_default("allow_public_rpc")
    ctx_floor: int = _router_default("ctx_floor")
    ctx_default: int = _router_default("ctx_default")
    log_lines: int = _router_default("log_lines")
    replica_logs: Path = Path("logs")
    replica_log_files: int = _router_default("replica_log_files")
    replica_log_max_mib: int = _router_default("replica_log_max_mib")
    kv_store: bool = _router_default("kv_store")
    kv_store_dir: Path = Path("kv")
    kv_store_mib: int = _router_default("kv_store_mib")
    kv_store_timeout: float = _router_default("kv_store_timeout")


@attrs.frozen
class Config:
    """A whole validated configuration. ``devices`` is keyed by GPU id; ``rpc_devices``, ``models``,
    ``pools``, ``peers`` and ``keys`` by name, in file order."""

    path: Path
    router: RouterSettings = attrs.field(factory=RouterSettings)
    devices: FrozenMap[int, DeviceConfig] = attrs.field(factory=FrozenMap, converter=_frozen_map)
    rpc_devices: FrozenMap[str, RpcDeviceConfig] = attrs.field(factory=FrozenMap, converter=_frozen_map)
    defaults: FrozenMap[str, FlagValue] = attrs.field(factory=FrozenMap, converter=_frozen_map)
    models: FrozenMap[str, ModelConfig] = attrs.field(factory=FrozenMap, converter=_frozen_map)
    pools: FrozenMap[str, PoolConfig] = attrs.field(factory=FrozenMap, converter=_frozen_map)
    peers: FrozenMap[str, PeerConfig] = attrs.field(factory=FrozenMap, converter=_frozen_map)
    keys: FrozenMap[str, KeyConfig] = attrs.field(factory=FrozenMap, converter=_frozen_map)
