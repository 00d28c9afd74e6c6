"""The llama-server command line and environment of one replica, and the spelling rules of its flags.

Pass-through flags come from ``[defaults]`` and from the model's own table. A key written with leading
dashes is used as written; a bare key gets ``-`` when it is a single letter or one of llama-server's
multi-letter short names (``ctk``, ``fa``, ...) and ``--`` otherwise. Two spellings of one flag (``ctk``
and ``cache-type-k``) count as the same flag when the model's value replaces the default's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from router.config.values import FlagValue, ModelConfig

# llama-server's multi-letter short names (and single letters with a long form) → their long names.
SHORT_FLAGS: Mapping[str, str] = {
    "ctk": "cache-type-k",
    "ctv": "cache-type-v",
    "fa": "flash-attn",
    "ub": "ubatch-size",
    "b": "batch-size",
    "t": "threads",
    "tb": "threads-batch",
    "ts": "tensor-split",
    "sm": "split-mode",
    "mg": "main-gpu",
    "ot": "override-tensor",
    "dev": "device",
    "nkvo": "no-kv-offload",
    "kvu": "kv-unified",
    "cb": "cont-batching",
    "nocb": "no-cont-batching",
    "cram": "cache-ram",
    "a": "alias",
    "m": "model",
    "c": "ctx-size",
    "np": "parallel",
    "ngl": "gpu-layers",
    "kvo": "kv-offload",
    "no-kvu": "no-kv-unified",
    "cmoe": "cpu-moe",
    "ncmoe": "n-cpu-moe",
    "ncffn": "n-cpu-ffn",
    "mm": "mmproj",
    "mmu": "mmproj-url",
    "mmdev": "mmproj-device",
    "md": "model-draft",
    "ngld": "gpu-layers-draft",
    "ctkd": "cache-type-k-draft",
    "ctvd": "cache-type-v-draft",
    "otd": "override-tensor-draft",
    "cmoed": "cpu-moe-draft",
    "ncmoed": "n-cpu-moe-draft",
    "devd": "device-draft",
}

# Other long spellings of one flag → the long name used as its identity.
LONG_SYNONYMS: Mapping[str, str] = {
    "n-gpu-layers": "gpu-layers",
    "n-gpu-layers-draft": "gpu-layers-draft",
    "spec-draft-model": "model-draft",
    "spec-draft-ngl": "gpu-layers-draft",
    "spec-draft-type-k": "cache-type-k-draft",
    "spec-draft-type-v": "cache-type-v-draft",
    "spec-draft-override-tensor": "override-tensor-draft",
    "spec-draft-cpu-moe": "cpu-moe-draft",
    "spec-draft-n-cpu-moe": "n-cpu-moe-draft",
    "spec-draft-ncmoe": "n-cpu-moe-draft",
    "spec-draft-device": "device-draft",
}

# Flags the router sets itself (by identity) → what to do instead.
ROUTER_OWNED: Mapping[str, str] = {
    "host": "the router binds every replica to loopback itself",
    "port": "the router gives every replica its own port",
    "model": "set the GGUF file with the `model` key of [models.NAME]",
    "ctx-size": "use the `ctx` key of [models.NAME]",
    "parallel": "use the `parallel` key of [models.NAME]",
    "gpu-layers": "use the `gpu_layers` key of [models.NAME]",
    "cache-ram": "use the `cram` key (MiB per replica) of [models.NAME] or [defaults]",
    "fit": "the router always passes --fit off so that weights never spill to the CPU",
    "api-key": "replicas listen on loopback only; set router.api_keys to protect the router",
    "api-key-file": "replicas listen on loopback only; set router.api_keys_file to protect the router",
    "models-dir": "the router manages models itself (one llama-server per model replica)",
    "models-max": "the router manages models itself (one llama-server per model replica)",
    "device": "each replica sees only its model's GPUs (CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES), "
    "renumbered from 0, so a device name written for the whole machine picks another card or none; "
    "choose GPUs with the `gpus` key of [models.NAME]",
    "rpc": "declare each rpc-server as [rpc_devices.NAME] (endpoint, memory_mib) and list it in the "
    "model's `rpc` key, so that placement counts its memory and the endpoint is checked",
    "main-gpu": "each replica sees only its model's GPUs, renumbered from 0, so an index written for the "
    "whole machine picks another card or none; order the model's `gpus` instead (the first is GPU 0 there)",
}

DEFAULT_CACHE_TYPE = "f16"


def flag_identity(key: str) -> str:
    """The long name a key stands for, whatever its spelling: "-ctk", "ctk" and "--cache-type-k" all give
    "cache-type-k"."""
    name = key.lstrip("-")
    name = SHORT_FLAGS.get(name, name)
    return LONG_SYNONYMS.get(name, name)


def render_flag(key: str) -> str:
    """The flag as it appears on the command line (see the module docstring for the rules)."""
    if key.startswith("-"):
        return key
    if len(key) == 1 or key in SHORT_FLAGS:
        return "-" + key
    return "--" + key


def router_owned_hint(key: str) -> str | None:
    """Why the router refuses this pass-through key, or None when llama-server may have it."""
    return ROUTER_OWNED.get(flag_identity(key))


def _pairs(
    flags: Mapping[str, FlagValue] | Iterable[tuple[str, FlagValue]],
) -> Iterable[tuple[str, FlagValue]]:
    return flags.items() if isinstance(flags, Mapping) else flags


def merged_flags(
    defaults: Mapping[str, FlagValue] | Iterable[tuple[str, FlagValue]],
    own: Mapping[str, FlagValue] | Iterable[tuple[str, FlagValue]],
) -> list[tuple[str, FlagValue]]:
    """[defaults] then the model's own flags; a model flag replaces the default of the same identity in place.

    ``false`` values are kept here (they are what lets a model switch a default off); rendering drops them.
    """
    merged: dict[str, tuple[str, FlagValue]] = {}
    for source in (defaults, own):
        for key, value in _pairs(source):
            merged[flag_identity(key)] = (key, value)
    return list(merged.values())


def _scalar(value: str | int | float) -> str:
    return value if isinstance(value, str) else str(value)


def render_flags(flags: Iterable[tuple[str, FlagValue]]) -> list[str]:
    """Command-line words for (key, value) pairs: true → flag, false → nothing, list → flag per item."""
    words: list[str] = []
    for key, value in flags:
        flag = render_flag(key)
        if value is True:
            words.append(flag)
        elif value is False:
            continue
        elif isinstance(value, list | tuple):
            for item in value:
                words += [flag, _scalar(item)]
        else:
            words += [flag, _scalar(value)]
    return words


def llama_server_argv(
    binary: str,
    model: ModelConfig,
    defaults: Mapping[str, FlagValue],
    *,
    port: int,
    ctx: int,
    gpu_layers: int,
    host: str = "127.0.0.1",
    cache_ram_mib: int | None = None,
) -> list[str]:
    """The full argv of one replica: the router's own flags, then the merged pass-through flags.

    ``cache_ram_mib`` is the host-memory prompt cache (``--cache-ram``; None: the flag is left out).

    Raises ValueError when a pass-through flag is one the router sets itself (a validated Config never
    has one).
    """
    flags = merged_flags(defaults, model.extra_args)
    for key, _ in flags:
        hint = router_owned_hint(key)
        if hint is not None:
            raise ValueError(f"llama-server flag {key!r} of model {model.name} is set by the router: {hint}")
    argv = [
        binary,
        "--host",
        host,
        "--port",
        str(port),
        "-m",
        str(model.path),
        "-c",
        str(ctx),
        "-np",
        str(model.parallel),
        "-ngl",
        str(gpu_layers),
        "--fit",
        "off",
    ]
    if cache_ram_mib is not None:
        argv += ["--cache-ram", str(cache_ram_mib)]
    return argv + render_flags(flags)


def gpu_env(gpus: Sequence[int]) -> dict[str, str]:
    """Environment that shows a replica only these GPUs (CUDA and ROCm); an empty list hides them all.

    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbers CUDA devices the way NVML does (by PCI bus id), so GPU N in
    the config is the card whose memory the router measured as GPU N, on machines with mixed models too.
    """
    visible = ",".join(str(gpu) for gpu in gpus)
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": visible,
        "HIP_VISIBLE_DEVICES": visible,
    }


def cache_types(
    model: ModelConfig, defaults: Mapping[str, FlagValue] | Iterable[tuple[str, FlagValue]]
) -> tuple[str, str]:
    """The effective (K, V) cache types of a model's replicas; "f16" unless a flag says otherwise."""
    found = {flag_identity(key): value for key, value in merged_flags(defaults, model.extra_args)}

    def pick(identity: str) -> str:
        value = found.get(identity)
        return value if isinstance(value, str) else DEFAULT_CACHE_TYPE

    return pick("cache-type-k"), pick("cache-type-v")
