"""From configuration (and the placement plan) to what the scheduler and the supervisor need.

``ModelLaunch`` holds how one model's replicas are started (binary, context, GPU layers, flags);
``scheduler_settings`` turns the configuration into the scheduler's static ``Settings``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from router.config.llama_args import gpu_env, llama_server_argv
from router.config.load import Config, ConfigError, resolve_gpus
from router.config.values import KeyConfig, ModelConfig, RouterSettings
from router.deploy.masking import Masks
from router.deploy.rpc_devices import exclusive_need, model_devices, rpc_argv, rpc_devices
from router.placement.prompt_cache import CRAM_MIN_MIB

if TYPE_CHECKING:
    from statemachine import Settings

DEFAULT_CTX = 4096
ALL_LAYERS = 999


@attrs.frozen
class ModelLaunch:
    """How replicas of one model start: every value already decided (``cram_mib``: ``--cache-ram``).

    ``gpus`` are the local GPUs (masked for the replica); ``rpc`` the words that reach its RPC devices
    (``--rpc host:port,...``, empty without any). ``tensor_split`` is in llama.cpp's device order: RPC
    devices first, then the GPUs. ``binary`` is the model's own llama-server where it names one; ``masks``
    the device masks of that binary's Vulkan or SYCL backend (None: the router's binary's, which the
    deployment holds).
    """

    model: ModelConfig
    binary: str
    defaults: Mapping[str, object]
    gpus: tuple[int, ...]
    ctx: int
    gpu_layers: int
    tensor_split: tuple[int, ...] = ()
    cram_mib: int | None = None
    rpc: tuple[str, ...] = ()
    # A model the scheduler places: the layer split of each GPU set it may load on.
    splits: Mapping[tuple[int, ...], tuple[int, ...]] = attrs.field(factory=dict)
    masks: Masks | None = None

    def environment(self, gpus: Sequence[int], masks: Masks) -> dict[str, str]:
        """The variables a replica on ``gpus`` gets besides the router's own environment: the model's
        ``env``, then the masks that show it only its GPUs (``masks``: the router's binary's, used unless
        this model's binary has its own); the model's ``env`` never names a mask (the config refuses it)."""
        own = self.masks if self.masks is not None else masks
        return dict(self.model.env) | gpu_env(gpus) | own.env(gpus)

    def on(self, gpus: tuple[int, ...]) -> ModelLaunch:
        """How a replica on ``gpus`` starts: for a model the scheduler places, with that set's layer split."""
        if gpus not in self.splits:
            return self
        return attrs.evolve(self, gpus=gpus, tensor_split=self.splits[gpus])

    @property
    def ctx_per_slot(self) -> int:
        return self.ctx // max(1, self.model.parallel)

    def argv(self, port: int) -> tuple[str, ...]:
        argv = llama_server_argv(
            self.binary,
            self.model,
            self.defaults,
            port=port,
            ctx=self.ctx,
            gpu_layers=self.gpu_layers,
            cache_ram_mib=self.cram_mib,
        )
        argv += self.rpc
        if not any(a in ("-a", "--alias") for a in argv):
            argv += ["--alias", self.model.name]  # replies name the model as clients know it
        if len(self.tensor_split) > 1 and not any(a in ("-ts", "--tensor-split") for a in argv):
            # Split layers as placement planned, not by whatever memory happens to be free at load.
            argv += ["--tensor-split", ",".join(str(share) for share in self.tensor_split)]
        return tuple(argv)


@attrs.frozen
class ModelDecision:
    """What placement decided for a model (context, layers, bytes per GPU, refusal, prompt-cache MiB)."""

    ctx: int
    gpu_layers: int
    need: Mapping[int, int] = attrs.field(factory=dict)
    refusal: str | None = None
    tensor_split: tuple[int, ...] = ()
    cram_mib: int | None = None
    # A model the scheduler places (gpus = "any"): each GPU set it may load on, with the bytes a replica needs
    # on each of its GPUs and its layer split there.
    choices: Mapping[tuple[int, ...], tuple[Mapping[int, int], tuple[int, ...]]] = attrs.field(factory=dict)


def gpu_ids(config: Config, detected: int) -> tuple[int, ...]:
    """The GPU ids the router schedules over: num_gpus, else detection, else what the config names."""
    if config.router.num_gpus is not None:
        return tuple(range(config.router.num_gpus))
    if detected:
        return tuple(range(detected))
    named = set(config.devices)
    for model in config.models.values():
        if isinstance(model.gpus, tuple):
            named.update(model.gpus)
    return tuple(range(max(named) + 1)) if named else (0,)


def default_decision(model: ModelConfig) -> ModelDecision:
    """What a model starts with when placement has no prediction: its own settings, else every layer on
    its GPUs (none for a CPU-only model), the default context and the smallest automatic prompt cache."""
    layers = ALL_LAYERS if model.gpu_layers is None else model.gpu_layers
    if model.gpus == () and not model.rpc:
        layers = 0
    cram = CRAM_MIN_MIB if model.cram is None else model.cram
    return ModelDecision(ctx=model.ctx or DEFAULT_CTX, gpu_layers=layers, cram_mib=cram)


def launches(
    config: Config,
    binary: str,
    ids: Sequence[int],
    decisions: Mapping[str, ModelDecision],
    own: Mapping[str, str] | None = None,
    masks: Mapping[str, Masks] | None = None,
) -> dict[str, ModelLaunch]:
    """How each model's replicas start; ``own`` maps a model with a binary of its own to that binary, and
    ``masks`` such a binary to its devices' masks."""
    own, masks = own or {}, masks or {}
    out = {}
    for name, model in config.models.items():
        decision = decisions.get(name) or default_decision(model)
        their = own.get(name, binary)
        out[name] = ModelLaunch(
            model=model,
            binary=their,
            defaults=config.defaults,
            gpus=resolve_gpus(model, ids),
            ctx=decision.ctx,
            gpu_layers=decision.gpu_layers,
            tensor_split=decision.tensor_split,
            cram_mib=decision.cram_mib,
            rpc=rpc_argv(config, model),
            splits={gpus: split for gpus, (_, split) in decision.choices.items()},
            masks=masks.get(their) if their != binary else None,
        )
    return out


def scheduler_settings(
    config: Config,
    ids: Sequence[int],
    decisions: Mapping[str, ModelDecision],
    budgets: Mapping[int, int | None],
) -> Settings:
    """The scheduler's static inputs. A model's devices are its RPC devices (ids from
    ``router.deploy.rpc_devices``) and its GPUs; an RPC device's need is its whole budget (one client at a
    time). Each ``[keys.NAME]`` gives its weight by name; the router's ``max_wait_*`` the policy's waits."""
    # Imported here: `plan` and `init` use this module's decisions but not the scheduler.
    from statemachine import DeviceSpec, ModelSpec, Placement, Policy, PoolSpec, Settings

    fallback_members = {m for p in config.pools.values() if p.fallback for m in p.members}
    models = []
    for name, model in config.models.items():
        decision = decisions.get(name) or default_decision(model)
        pooled = name in fallback_members
        devices = model_devices(config, model, resolve_gpus(model, ids))
        common: dict[str, Any] = {
            "replicas": model.num_instance,
            "slots": model.parallel,
            "ctx_per_slot": decision.ctx // max(1, model.parallel),
            "pinned": model.pinned or pooled,
            "ttl": model.ttl if model.ttl is not None or model.pinned or pooled else config.router.ttl,
            "load_on_startup": model.load_on_startup or pooled,
            "refusal": decision.refusal,
        }
        if decision.choices:
            choices = [Placement(gpus, need) for gpus, (need, _) in decision.choices.items()]
            models.append(ModelSpec.anywhere(name, choices, spread=model.spread, **common))
            continue
        need = exclusive_need(decision.need, devices, budgets)
        models.append(ModelSpec(name=name, gpus=devices, need=need, **common))
    # Members served by peers join in router.deploy.peer_settings, once they are known.
    pools = [
        PoolSpec(p.name, tuple(m for m in p.members if m in config.models), p.fallback)
        for p in config.pools.values()
    ]
    devices = [DeviceSpec(g, budgets.get(g)) for g in ids]
    devices += [DeviceSpec(rpc.id, rpc.budget) for rpc in rpc_devices(config)]
    r = config.router
    policy = Policy(
        max_models_per_gpu=r.max_models_per_gpu,
        eviction=r.eviction,
        **swap_policy(r),
        queue_force_load_timeout=r.queue_force_load_timeout,
        queue_limit=r.queue_limit,
        routing_queue_limit=r.routing_queue_limit,
        affinity_guard=r.affinity_guard,
        max_wait=(r.max_wait_interactive, r.max_wait_standard, r.max_wait_batch),
    )
    weights = {name: key.weight for name, key in config.keys.items()}
    return Settings(
        models=models,
        pools=pools,
        devices=devices,
        policy=policy,
        weights=weights,
        max_queued=key_queue_limits(config.keys, r.queue_limit),
    )


def swap_policy(r: RouterSettings) -> dict[str, Any]:
    """The scheduler's swap knobs: batching (the default), or the timed order of ``queue_head_grace``."""
    if r.queue_head_grace is not None:
        return {"queue_head_grace": r.queue_head_grace, "min_residency": r.min_residency}
    return {
        "queue_head_grace": r.swap_batch_window,
        "swap_batch_max": r.swap_batch_max,
        "swap_hold": r.swap_hold,
        "min_residency": r.min_residency,
    }


def key_queue_limits(keys: Mapping[str, KeyConfig], queue_limit: int) -> dict[str, int]:
    """Each named key's own bound on its waiting requests: its ``max_queued``; where two or more named keys
    are configured, one without it may hold at most half of ``queue_limit``, so that no single client can
    fill the queue for everybody. (One named key alone, or none, is bounded by ``queue_limit`` only.)"""
    limits = {name: key.max_queued for name, key in keys.items() if key.max_queued is not None}
    if len(keys) >= 2:
        for name in keys:
            limits.setdefault(name, queue_limit // 2)
    return limits


def check_pinned(config: Config, settings: Settings) -> None:
    """Refuse a configuration whose pinned models (pinned, or members of fallback pools) cannot all stay
    resident: more on one GPU than ``max_models_per_gpu``, or more predicted bytes than its budget."""
    cap = settings.policy.max_models_per_gpu
    rpc_ids = set()
    for rpc in rpc_devices(config):
        rpc_ids.add(rpc.id)
        pinned = [m.name for m in settings.models.values() if m.pinned and rpc.id in m.gpus]
        if len(pinned) > 1:
            raise ConfigError(
                config.path,
                f"models pinned to rpc_devices.{rpc.name} ({', '.join(pinned)}; members of fallback pools "
                "count as pinned) cannot stay loaded together: an rpc-server serves one client at a time, "
                "so one replica holds the device; unpin all but one or give them other devices",
                key=f"rpc_devices.{rpc.name}",
            )
    for device in sorted(settings.devices.values(), key=lambda d: d.id):
        if device.id in rpc_ids:
            continue
        # A pinned model the scheduler places (gpus = "any") holds no GPU of its own here: it loads where it
        # fits, or its requests are answered with why.
        pinned = [m for m in settings.models.values() if m.pinned and device.id in m.gpus and not m.chooses]
        names = ", ".join(m.name for m in pinned)
        if len(pinned) > cap:
            raise ConfigError(
                config.path,
                f"models pinned to GPU {device.id} ({names}; members of fallback pools count as pinned) "
                f"exceed max_models_per_gpu = {cap}: raise the cap, unpin a model or move it to another GPU",
                key="router.max_models_per_gpu",
            )
        need = sum(m.need_on(device.id) * m.replicas for m in pinned)
        if device.budget is not None and need > device.budget:
            raise ConfigError(
                config.path,
                f"models pinned to GPU {device.id} ({names}) need {need / 2**30:.2f} GiB together but the "
                f"GPU has {device.budget / 2**30:.2f} GiB: unpin one or give it other GPUs",
                key=f"devices.{device.id}",
            )
