"""The llama-server flags that move memory, read from a model's configuration for placement.

Placement (``router.placement``) is arithmetic on GGUF headers; this module turns the pass-through flags of
``[defaults]`` and ``[models.NAME]`` into its inputs. Flags are read as llama-server will see them: the
merged list (``router.config.llama_args.merged_flags``: the model's value replaces the default's), any
spelling (``-ub``, ``ub``, ``--ubatch-size``; the draft flags' ``--spec-draft-*`` names too), ``false``
dropping the flag, and the last occurrence winning where llama-server keeps the last value. Each rule:

Micro-batch
    ``ubatch-size``/``ub`` (default 512) and ``batch-size``/``b`` (default 2048); placement uses
    ``min(ubatch, batch)``, as llama.cpp clamps ``n_ubatch`` to ``n_batch``.

KV layout
    ``kv-unified``/``kvu`` (``no-kv-unified``/``no-kvu`` turns it off again), ``swa-full``, and
    ``no-kv-offload``/``nkvo`` (``kv-offload``/``kvo`` back on): the KV cache then lives in host memory.

Layer split
    ``tensor-split``/``ts`` (``3,1`` or ``3/1``) replaces the budget-based split. ``split-mode``/``sm``:
    ``layer`` is what placement models; ``none`` puts everything on the model's first GPU (``main-gpu`` is
    the router's), modelled as a split of ``1,0,...``; ``row`` and ``tensor`` split each weight matrix
    (and, for ``tensor``, the KV cache) over the GPUs, which placement does not model: refused on a
    model with several GPUs, harmless (and modelled as ``layer``) on one.

Tensors kept in host memory
    ``override-tensor``/``ot`` entries ``PATTERN=CPU`` (comma-separated, or a list), ``cpu-moe``/``cmoe``,
    ``n-cpu-moe``/``ncmoe N`` and ``n-cpu-ffn``/``ncffn N`` become the regexes llama.cpp builds for them.
    A buffer type other than ``CPU`` (``CUDA0``, ...) names a device of the process, and the router's GPU
    masking renumbers devices, so it is refused; llama-server itself only knows the host buffer type as
    ``CPU``, upper case, so ``cpu`` is refused too (llama-server would stop with "unknown buffer type").
    ``no-op-offload`` is read as well: it decides whether host-kept weights borrow GPU compute memory.

Multimodal projector
    ``mmproj``/``mm`` (a path, relative to the config file's folder like ``model``); ``no-mmproj-offload``
    keeps it in host memory. ``mmproj-url`` (nothing local to read) and ``mmproj-device`` (a device name
    under masking) are refused.

Draft model
    ``model-draft``/``md`` (a path, like ``mmproj``), ``gpu-layers-draft``/``ngld`` (a number, ``all`` or
    ``auto``; default every layer), ``ctx-size-draft``/``cd`` (default: the main context; llama-server
    b11434 no longer has this flag and follows ``-c``), ``cache-type-k-draft``/``ctkd`` and
    ``cache-type-v-draft``/``ctvd`` (default f16), the draft's own tensor overrides
    (``override-tensor-draft``/``otd``, ``cpu-moe-draft``/``cmoed``, ``n-cpu-moe-draft``/``ncmoed``) and
    ``spec-draft-n-max`` (tokens drafted per step, default 3). Draft flags without a draft model are
    ignored; ``device-draft``/``devd`` is refused (a device name under masking).

Refused
    Besides those above: ``lora``/``lora-scaled`` (adapter weights beside the model), every
    ``control-vector*`` flag, and ``rpc`` (layers on remote devices placement does not see; a validated
    configuration never carries it: ``[rpc_devices.NAME]`` and the model's ``rpc`` key are the way). A value
    llama-server would not accept for a flag read here (``ub = "big"``) is refused too, naming the flag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from router.config.llama_args import flag_identity, merged_flags, render_flag
from router.config.values import FlagValue
from router.placement.extras import DEFAULT_DRAFT_MAX, DraftInput
from router.placement.kv_layout import CACHE_TYPES, DEFAULT_UBATCH
from router.placement.model_plan import DEFAULT_BATCH

__all__ = ["MemoryFlags", "flash_attn", "memory_flags"]

Flags = Mapping[str, FlagValue] | Iterable[tuple[str, FlagValue]]
# llama.cpp's regexes (common/common.h: LLM_FFN_EXPS_REGEX, LLM_FFN_DENSE_REGEX, llm_ffn_block_regex).
EXPERTS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
DENSE_FFN_REGEX = r"\.ffn_(up|down|gate)\."

# Spellings flag_identity does not know → the long name used here.
_NAMES: Mapping[str, str] = {"cd": "ctx-size-draft"}

# Flags placement cannot model → why.
_REFUSED: Mapping[str, str] = {
    "lora": "LoRA adapter weights are loaded beside the model",
    "lora-scaled": "LoRA adapter weights are loaded beside the model",
    "rpc": "layers may be placed on remote devices placement does not see",
    "mmproj-url": "a projector given by URL has no local header to read; download it and set mmproj",
    "mmproj-device": "a device name is renumbered by the router's GPU masking; the projector follows the "
    "model's first GPU without it",
    "device-draft": "a device name is renumbered by the router's GPU masking; the draft model follows the "
    "model's GPUs without it",
}
_FALSEY = ("off", "disabled", "false", "0")


class _Bad(ValueError):
    """A flag's value placement cannot read."""


@attrs.frozen
class _Flag:
    name: str  # the identity used here
    key: str  # as written
    value: FlagValue

    def text(self, value: FlagValue | None = None) -> str:
        shown = self.value if value is None else value
        flag = render_flag(self.key)
        return flag if shown is True else f"{flag} {shown}"

    def scalar(self) -> str | int | float | bool:
        """The value llama-server keeps for a repeated flag: the last one."""
        value = self.value
        if isinstance(value, tuple):
            if not value:
                raise _Bad(f"{render_flag(self.key)} has an empty list")
            return value[-1]
        return value

    def items(self) -> tuple[str | int | float, ...]:
        value = self.value
        if isinstance(value, tuple):
            return value
        if isinstance(value, bool):
            raise _Bad(f"{render_flag(self.key)} needs a value")
        return (value,)

    def integer(self) -> int:
        value = self.scalar()
        if isinstance(value, bool):
            raise _Bad(f"{render_flag(self.key)} needs a whole number")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        raise _Bad(f"{self.text()} (not a whole number)")


@attrs.frozen
class MemoryFlags:
    """What the flags say, as :class:`router.placement.model_plan.PlacementInput` keyword arguments."""

    ubatch: int = DEFAULT_UBATCH
    batch: int = DEFAULT_BATCH
    kv_unified: bool = False
    swa_full: bool = False
    kv_offload: bool = True
    op_offload: bool = True
    flash_attn: bool = True
    tensor_split: tuple[float, ...] = ()
    host_patterns: tuple[str, ...] = ()
    host_flags: tuple[str, ...] = ()
    mmproj: Path | None = None
    mmproj_offload: bool = True
    draft: DraftInput | None = None
    unsupported: tuple[str, ...] = ()

    def as_kwargs(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False)


def _read(defaults: Flags, own: Flags) -> list[_Flag]:
    """The flags llama-server gets, in command-line order, without the dropped ones."""
    out = []
    for key, value in merged_flags(defaults, own):
        if value is False:
            continue
        identity = flag_identity(key)
        out.append(_Flag(_NAMES.get(identity, identity), key, value))
    return out


def _last(flags: Sequence[_Flag], *names: str) -> _Flag | None:
    return next((f for f in reversed(flags) if f.name in names), None)


def _switch(flags: Sequence[_Flag], on: str, off: str, default: bool) -> bool:
    flag = _last(flags, on, off)
    return default if flag is None else flag.name == on


def _flash_attn(flags: Sequence[_Flag]) -> bool:
    flag = _last(flags, "flash-attn")
    return flag is None or str(flag.scalar()).strip().lower() not in _FALSEY


def flash_attn(defaults: Flags, own: Flags) -> bool:
    """llama-server's ``--flash-attn``: ``off`` (or ``disabled``, ``false``, ``0``) turns it off; ``on`` and
    ``auto`` (the default) count as on, and so does ``false`` in the config, which drops the flag."""
    return _flash_attn(_read(defaults, own))


def _path(flag: _Flag, base_dir: Path) -> Path:
    value = flag.scalar()
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{render_flag(flag.key)} needs a file path")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir / path


def _cache_type(flag: _Flag | None) -> str:
    if flag is None:
        return "f16"
    value = flag.scalar()
    if not isinstance(value, str) or value.lower() not in CACHE_TYPES:
        raise _Bad(f"{flag.text()} (not one of {', '.join(CACHE_TYPES)})")
    return value.lower()


def _host_patterns(
    flags: Sequence[_Flag], ot: str, cmoe: str, first_n: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """Regexes of the tensors kept in host memory and the flags that asked, in command-line order.

    ``first_n`` names the flags that keep the first N layers' experts (``n-cpu-moe``) or dense
    feed-forward weights (``n-cpu-ffn``) in host memory."""
    patterns: list[str] = []
    texts: list[str] = []
    for flag in flags:
        if flag.name == ot:
            for item in flag.items():
                for entry in str(item).split(","):
                    pattern, eq, buft = entry.partition("=")
                    if not eq:
                        raise _Bad(f"{flag.text(entry)} (expects PATTERN=BUFFER_TYPE)")
                    if buft.upper() == "CPU" and buft != "CPU":
                        raise _Bad(
                            f"{flag.text(entry)} (llama-server knows the host buffer type only as CPU, "
                            "upper case, and would stop with 'unknown buffer type')"
                        )
                    if buft != "CPU":
                        raise _Bad(
                            f"{flag.text(entry)} (only the host buffer type CPU can be modelled: a device "
                            "buffer type names a device the router's GPU masking renumbers)"
                        )
                    try:
                        re.compile(pattern)
                    except re.error as exc:
                        raise _Bad(f"{flag.text(entry)} (not a regular expression: {exc})") from None
                    patterns.append(pattern)
                    texts.append(flag.text(entry))
        elif flag.name == cmoe:
            patterns.append(EXPERTS_REGEX)
            texts.append(flag.text(True))
        elif flag.name in first_n:
            n = flag.integer()
            if n < 0:
                raise _Bad(f"{flag.text()} (must not be negative)")
            regex = DENSE_FFN_REGEX if flag.name == "n-cpu-ffn" else EXPERTS_REGEX
            patterns += [rf"blk\.{i}{regex}" for i in range(n)]
            texts.append(flag.text(n))
    return patterns, texts


def _tensor_split(flag: _Flag | None, n_gpus: int, split_mode: str) -> tuple[float, ...]:
    if split_mode == "none" and n_gpus > 1:
        return (1.0,) + (0.0,) * (n_gpus - 1)
    if flag is None:
        return ()
    try:
        values = tuple(float(v) for v in re.split(r"[,/]+", str(flag.scalar()).strip()) if v)
    except ValueError:
        raise _Bad(f"{flag.text()} (expects proportions such as 3,1)") from None
    if not values or any(v < 0 for v in values):
        raise _Bad(f"{flag.text()} (expects proportions such as 3,1)")
    return values


def _split_mode(flag: _Flag | None, n_gpus: int) -> str:
    if flag is None:
        return "layer"
    mode = str(flag.scalar()).strip().lower()
    if mode not in ("none", "layer", "row", "tensor"):
        raise _Bad(f"{flag.text()} (not one of none, layer, row, tensor)")
    if mode in ("row", "tensor") and n_gpus > 1:
        what = "each weight matrix by rows" if mode == "row" else "weights and the KV cache"
        raise _Bad(f"{flag.text()} (splits {what} across the GPUs; placement models the layer split only)")
    return mode


def _positive(flag: _Flag | None, default: int) -> int:
    if flag is None:
        return default
    n = flag.integer()
    if n < 1:
        raise _Bad(f"{flag.text()} (must be at least 1)")
    return n


def _gpu_layers(flag: _Flag | None) -> int | None:
    if flag is None or str(flag.scalar()).strip().lower() in ("all", "auto"):
        return None
    n = flag.integer()
    return None if n < 0 else n


def _draft(flags: Sequence[_Flag], base_dir: Path) -> DraftInput | None:
    model = _last(flags, "model-draft")
    if model is None:
        return None
    ctx = _last(flags, "ctx-size-draft")
    n_max = _last(flags, "spec-draft-n-max")
    patterns, texts = _host_patterns(flags, "override-tensor-draft", "cpu-moe-draft", ("n-cpu-moe-draft",))
    return DraftInput(
        path=_path(model, base_dir),
        gpu_layers=_gpu_layers(_last(flags, "gpu-layers-draft")),
        ctx=ctx.integer() if ctx is not None and ctx.integer() > 0 else None,
        cache_type_k=_cache_type(_last(flags, "cache-type-k-draft")),
        cache_type_v=_cache_type(_last(flags, "cache-type-v-draft")),
        host_patterns=tuple(patterns),
        host_flags=tuple(texts),
        n_max=n_max.integer() if n_max is not None else DEFAULT_DRAFT_MAX,
    )


def _refusals(flags: Sequence[_Flag]) -> list[str]:
    out = []
    for flag in flags:
        reason = _REFUSED.get(flag.name)
        if reason is None and flag.name.startswith("control-vector"):
            reason = "control vectors are loaded beside the model"
        if reason is not None:
            out.append(f"{render_flag(flag.key)} ({reason})")
    return out


def memory_flags(
    defaults: Flags,
    own: Flags,
    *,
    n_gpus: int,
    base_dir: Path,
) -> MemoryFlags:
    """Read the memory-moving flags of one model (``[defaults]`` then its own table).

    ``n_gpus`` is how many GPUs the model uses; ``base_dir`` the folder relative paths start from (the
    config file's). Whatever cannot be modelled lands in ``unsupported``, one entry per flag, with the
    reason; the other fields are then defaults.
    """
    flags = _read(defaults, own)
    unsupported = _refusals(flags)
    try:
        mode = _split_mode(_last(flags, "split-mode"), n_gpus)
        ubatch = _positive(_last(flags, "ubatch-size"), DEFAULT_UBATCH)
        batch = _positive(_last(flags, "batch-size"), DEFAULT_BATCH)
        patterns, texts = _host_patterns(flags, "override-tensor", "cpu-moe", ("n-cpu-moe", "n-cpu-ffn"))
        mmproj = _last(flags, "mmproj")
        reading = MemoryFlags(
            ubatch=ubatch,
            batch=batch,
            kv_unified=_switch(flags, "kv-unified", "no-kv-unified", False),
            swa_full=_last(flags, "swa-full") is not None,
            kv_offload=_switch(flags, "kv-offload", "no-kv-offload", True),
            op_offload=_switch(flags, "op-offload", "no-op-offload", True),
            flash_attn=_flash_attn(flags),
            tensor_split=_tensor_split(_last(flags, "tensor-split"), n_gpus, mode),
            host_patterns=tuple(patterns),
            host_flags=tuple(texts),
            mmproj=_path(mmproj, base_dir) if mmproj is not None else None,
            mmproj_offload=_switch(flags, "mmproj-offload", "no-mmproj-offload", True),
            draft=_draft(flags, base_dir),
        )
    except _Bad as exc:
        return MemoryFlags(unsupported=(*unsupported, str(exc)))
    return attrs.evolve(reading, unsupported=tuple(unsupported))
