"""What a llama-server process holds besides its model: host-kept tensors, a projector, a draft model.

Pure arithmetic on GGUF headers, like ``footprint``; the flags that ask for these are read elsewhere
(``router.deploy.memory_flags``).

Tensors kept in host memory
    ``--override-tensor PATTERN=CPU`` (also written as one ``P1=CPU,P2=CPU`` list), ``--cpu-moe`` and
    ``--n-cpu-moe N`` all become regular expressions over tensor names; llama.cpp searches each name
    (``std::regex_search``: a match anywhere in the name) and the first pattern that matches decides.
    ``--cpu-moe`` is ``\\.ffn_(up|down|gate|gate_up)_(ch|)exps``, ``--n-cpu-moe N`` the same prefixed by
    ``blk\\.i`` for each layer i < N. Every pattern placement accepts sends its tensors to the CPU, so the
    order does not matter here: :func:`host_tensor_bytes` sums, per layer, the bytes of every tensor some
    pattern matches (the input tensors are in host memory anyway and are left out).

Multimodal projector (``--mmproj``)
    llama.cpp's mtmd loads every tensor of the projector file onto one device: the first GPU the process
    sees (the model's first GPU; under ``CUDA_VISIBLE_DEVICES`` that is its device 0), or host memory with
    ``--no-mmproj-offload``. Its compute buffer is sized at load by a warm-up image; no closed form is
    exact, so :func:`projector_from_header` estimates it on the safe side from the vision tower's keys:
    ``n_pos = (image_size / patch_size)^2`` positions (more when ``image_max_pixels`` allows more), and
    ``4 * n_pos * (6 * n_embd + 3 * n_ff)`` bytes of f32 activations (the text model's feed-forward rule
    with an extra residual), plus the attention scores ``4 * n_head * n_pos^2`` when flash attention is
    off (the projector follows the server's ``--flash-attn``). A projector without those keys (an audio
    encoder, an unknown layout) is given a fixed :data:`PROJECTOR_COMPUTE_MARGIN` of 512 MiB; no estimate
    is below :data:`PROJECTOR_COMPUTE_MIN` (128 MiB).

Draft model (``--model-draft``)
    In llama.cpp b11434 the draft context is built from the main model's parameters
    (``common_base_params_to_speculative``): the same visible devices, split mode and ``--tensor-split``,
    the same context size, slot count, micro-batch, unified/SWA-full/KV-offload settings and flash
    attention; only the model, its ``-ngld`` (default: every layer), its tensor overrides and its cache
    types (``-ctkd``/``-ctvd``, default f16) are its own. So placement estimates the draft as a second
    model on the main model's GPUs, split with the main model's shares, at the main context, and adds its
    weights, KV cache, recurrent state and compute buffer to each GPU (no second reserve: one process).
    :func:`add_draft` does the addition.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import attrs

from router.placement.footprint import CPU, Footprint
from router.placement.geometry import FootprintError, ModelGeometry, geometry_from_header, tensor_layer
from router.placement.gguf_header import GGUFError, GGUFHeader, read_header

__all__ = [
    "PROJECTOR_COMPUTE_MARGIN",
    "PROJECTOR_COMPUTE_MIN",
    "DraftInput",
    "Extras",
    "HostTensors",
    "Projector",
    "add_draft",
    "add_projector",
    "host_tensor_bytes",
    "projector_from_header",
    "read_extras",
]

MiB = 1 << 20
PROJECTOR_COMPUTE_MARGIN = 512 * MiB
PROJECTOR_COMPUTE_MIN = 128 * MiB
DEFAULT_DRAFT_MAX = 3  # llama.cpp's --spec-draft-n-max default


def _path(value: str | Path) -> Path:
    return Path(value)


@attrs.frozen
class DraftInput:
    """A draft model as the operator configured it.

    ``gpu_layers`` None offloads every layer (llama.cpp's default); ``ctx`` None uses the main context
    (b11434 has no separate draft context; older builds' ``--ctx-size-draft`` is honoured when given);
    ``host_patterns`` are its own tensor overrides (``-otd``, ``-cmoed``, ``-ncmoed``) and ``host_flags``
    how they were written; ``n_max`` the tokens drafted per step, which sets how many rows of logits the
    main model computes per slot (``1 + n_max``).
    """

    path: Path = attrs.field(converter=_path)
    gpu_layers: int | None = None
    ctx: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    host_patterns: tuple[str, ...] = ()
    host_flags: tuple[str, ...] = ()
    n_max: int = DEFAULT_DRAFT_MAX


@attrs.frozen
class HostTensors:
    """Tensors some pattern keeps in host memory: ``by_layer[i]`` bytes of layer i (the last entry is the
    output layer), ``count`` tensors in all."""

    by_layer: tuple[int, ...]
    count: int

    @property
    def total(self) -> int:
        return sum(self.by_layer)


def host_tensor_bytes(header: GGUFHeader, n_layer: int, patterns: Sequence[str]) -> HostTensors:
    """Bytes per layer of the tensors whose names one of ``patterns`` matches (``re.search``)."""
    try:
        compiled = [re.compile(p) for p in patterns]
    except re.error as exc:
        raise FootprintError(f"a tensor override pattern is not a valid regular expression: {exc}") from None
    by_layer = [0] * (n_layer + 1)
    count = 0
    for t in header.tensors:
        layer = tensor_layer(t.name, n_layer)
        if layer is None or not any(p.search(t.name) for p in compiled):
            continue
        by_layer[layer] += t.n_bytes
        count += 1
    return HostTensors(by_layer=tuple(by_layer), count=count)


@attrs.frozen
class Projector:
    """A multimodal projector: its weights and compute-buffer estimate, both in bytes, with and without
    flash attention (see the module docstring); ``basis`` says what the estimate rests on."""

    weights: int
    compute_flash: int
    compute_plain: int
    basis: str

    def compute(self, flash_attn: bool) -> int:
        return self.compute_flash if flash_attn else self.compute_plain


def _positive(header: GGUFHeader, key: str) -> int:
    value = header.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def projector_from_header(header: GGUFHeader) -> Projector:
    """The projector's tensor bytes and a conservative compute estimate (see the module docstring)."""
    image = _positive(header, "clip.vision.image_size")
    patch = _positive(header, "clip.vision.patch_size")
    n_embd = _positive(header, "clip.vision.embedding_length")
    n_ff = _positive(header, "clip.vision.feed_forward_length")
    n_head = _positive(header, "clip.vision.attention.head_count")
    if not (image and patch and n_embd and image >= patch):
        margin = PROJECTOR_COMPUTE_MARGIN
        return Projector(header.n_bytes, margin, margin, "fixed margin (no vision image/patch size keys)")
    n_pos = (image // patch) ** 2
    max_pixels = _positive(header, "clip.vision.image_max_pixels")
    n_pos = max(n_pos, max_pixels // (patch * patch))
    activations = 4 * n_pos * (6 * n_embd + 3 * n_ff)
    scores = 4 * max(n_head, 1) * n_pos * n_pos
    return Projector(
        weights=header.n_bytes,
        compute_flash=max(activations, PROJECTOR_COMPUTE_MIN),
        compute_plain=max(activations + scores, PROJECTOR_COMPUTE_MIN),
        basis=f"{n_pos} image positions",
    )


def add_projector(fp: Footprint, projector: Projector, *, offload: bool, flash_attn: bool) -> Footprint:
    """``fp`` with the projector on its first device (or its weights in host memory when not offloaded).

    A model that runs on the CPU alone has the projector on its CPU row. A projector kept on the host adds
    its weights to ``host_weights`` but not its compute buffer (no host compute buffer is counted there).
    """
    if not fp.devices:
        raise FootprintError("no device to place the projector on")
    first = fp.devices[0]
    if not offload and first.device != CPU:
        return attrs.evolve(fp, host_weights=fp.host_weights + projector.weights)
    compute = projector.compute(flash_attn)
    row = attrs.evolve(
        first,
        weights=first.weights + projector.weights,
        compute=first.compute + compute,
        projector=first.projector + projector.weights + compute,
    )
    return attrs.evolve(fp, devices=(row, *fp.devices[1:]))


def add_draft(fp: Footprint, draft: Footprint) -> Footprint:
    """``fp`` with a draft model's footprint (estimated on the same devices, reserve 0) added row by row."""
    if [d.device for d in draft.devices] != [d.device for d in fp.devices]:
        raise FootprintError("the draft model must be estimated on the main model's devices")
    rows = tuple(
        attrs.evolve(
            main,
            weights=main.weights + extra.weights,
            kv_per_token=main.kv_per_token + extra.kv_per_token,
            kv=main.kv + extra.kv,
            recurrent=main.recurrent + extra.recurrent,
            compute=main.compute + extra.compute,
            draft=main.draft + extra.total - extra.reserve,
        )
        for main, extra in zip(fp.devices, draft.devices, strict=True)
    )
    return attrs.evolve(
        fp,
        devices=rows,
        host_weights=fp.host_weights + draft.host_weights,
        host_kv=fp.host_kv + draft.host_kv,
    )


@attrs.frozen
class Extras:
    """What the headers of a model's companions say: the main model's host-kept tensors, its projector,
    its draft model's geometry and the draft's host-kept tensors (None: not configured)."""

    host: HostTensors | None = None
    projector: Projector | None = None
    draft: ModelGeometry | None = None
    draft_host: HostTensors | None = None


def read_extras(
    header: GGUFHeader,
    geometry: ModelGeometry,
    *,
    host_patterns: Sequence[str] = (),
    mmproj: Path | None = None,
    draft: DraftInput | None = None,
) -> Extras:
    """Read the projector's and the draft model's headers and match the tensor overrides.

    Raises GGUFError for a file that cannot be read or is not a GGUF file, FootprintError for a draft
    header that lacks what the arithmetic needs (or a pattern that is not a regular expression); the
    message says which file.
    """
    host = host_tensor_bytes(header, geometry.n_layer, host_patterns) if host_patterns else None
    projector = None
    if mmproj is not None:
        projector = projector_from_header(_read(mmproj, "the projector"))
    draft_geometry = draft_host = None
    if draft is not None:
        draft_header = _read(draft.path, "the draft model")
        try:
            draft_geometry = geometry_from_header(draft_header)
        except FootprintError as exc:
            raise FootprintError(f"the draft model {draft.path}: {exc}") from None
        if draft.host_patterns:
            draft_host = host_tensor_bytes(draft_header, draft_geometry.n_layer, draft.host_patterns)
    return Extras(host=host, projector=projector, draft=draft_geometry, draft_host=draft_host)


def _read(path: Path, what: str) -> GGUFHeader:
    try:
        return read_header(path)
    except GGUFError as exc:  # its message names the file
        raise GGUFError(f"cannot read {what}: {exc}") from None
    except OSError as exc:
        raise GGUFError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
