"""The models in a folder: which GGUF files are models, which are shards of one, which are projectors.

``scan_folder(DIR)`` walks DIR and its sub-folders (names starting with ``.`` are skipped; links to files
are followed, links to folders are not) and reads the header of every ``.gguf`` file it finds (the first
shard only, for split models):

* one model per file, named after the file without ``.gguf`` (``Qwen2.5-7B-Instruct-Q4_K_M.gguf`` serves
  ``Qwen2.5-7B-Instruct-Q4_K_M``); whitespace in a name becomes ``-`` and other characters a model name
  cannot hold are dropped (with a warning);
* ``NAME-00001-of-00003.gguf`` … ``NAME-00003-of-00003.gguf`` are one model, ``NAME``, loaded from its first
  shard; a split model with a shard missing is skipped;
* a multimodal projector — a file whose name contains ``mmproj``, or whose header says ``general.type =
  mmproj`` or ``general.architecture = clip`` — is not a model: it goes with the models of its folder that
  share the longest name prefix with it (``mmproj-`` left out, the prefix counted up to a ``-``, ``_`` or
  space), or, when nothing shares a prefix and its folder holds exactly one model, with that model. Where
  both headers say so, the projector's output width (``clip.vision.projection_dim``) must equal the model's
  embedding width. A model that several projectors fit gets the best match (the first by name on a tie);
* LoRA adapters (``general.type = adapter``) and files without tensors (tokenizer-only files) are skipped.

Two models with the same name: the first one found keeps it and the other is skipped. Every skip, renaming
and unpaired projector is a warning naming the file.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import attrs

from router.config.tables import MAX_NAME, valid_name
from router.placement.gguf_header import GGUFError, GGUFHeader, read_file_header

__all__ = ["FolderModel", "FolderScan", "ModelFacts", "scan_folder"]

SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_SEPARATORS = "-_ "
_MMPROJ = re.compile(r"[-_. ]*mmproj[-_. ]*", re.IGNORECASE)


@attrs.frozen
class ModelFacts:
    """What a model's header says, for the comments ``init`` writes."""

    architecture: str
    layers: int | None
    trained_ctx: int | None
    embedding: int | None
    size_bytes: int  # all of its files


@attrs.frozen
class FolderModel:
    """One model found in the folder: ``path`` is the file llama-server loads (the first shard)."""

    name: str
    path: Path
    files: tuple[Path, ...]
    facts: ModelFacts
    mmproj: Path | None = None


@attrs.frozen
class FolderScan:
    folder: Path
    models: tuple[FolderModel, ...]
    warnings: tuple[str, ...]


@attrs.frozen
class _Projector:
    path: Path
    width: int | None  # clip.vision.projection_dim

    @property
    def key(self) -> str:
        """The projector's name with ``mmproj`` left out, to compare with model names."""
        return _MMPROJ.sub("-", _stem(self.path.name)).strip("-_. ")


class FolderError(ValueError):
    """The folder cannot be scanned (it does not exist, or is not a folder)."""


def scan_folder(folder: Path) -> FolderScan:
    folder = folder.expanduser().absolute()
    if not folder.is_dir():
        raise FolderError(f"{folder} is not a folder" if folder.exists() else f"{folder} does not exist")
    warnings: list[str] = []
    models: list[FolderModel] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        paths = [
            Path(root) / f for f in sorted(files) if f.lower().endswith(".gguf") and not f.startswith(".")
        ]
        if paths:
            found, projectors = _classify(paths, warnings)
            models += _pair(found, projectors, warnings)
    unique: dict[str, FolderModel] = {}
    for model in models:
        first = unique.get(model.name)
        if first is not None:
            warnings.append(f"skipped {model.path}: the name {model.name!r} is already taken by {first.path}")
            continue
        unique[model.name] = model
    return FolderScan(folder, tuple(unique.values()), tuple(warnings))


def _stem(file_name: str) -> str:
    return file_name[:-5] if file_name.lower().endswith(".gguf") else file_name


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _classify(paths: list[Path], warnings: list[str]) -> tuple[list[FolderModel], list[_Projector]]:
    """The models and projectors among the .gguf files of one folder."""
    candidates: list[tuple[str, tuple[Path, ...]]] = []
    splits: dict[tuple[str, int], dict[int, Path]] = {}
    for path in paths:
        match = SPLIT_RE.match(path.name)
        if match is None:
            candidates.append((_stem(path.name), (path,)))
        else:
            splits.setdefault((match["stem"], int(match["count"])), {})[int(match["index"])] = path
    for (stem, count), shards in splits.items():
        missing = [i for i in range(1, count + 1) if i not in shards]
        if count < 1 or missing:
            shown = ", ".join(f"{i:05d}" for i in missing) or "all"
            folder = paths[0].parent
            warnings.append(
                f"skipped the split model {stem} in {folder}: shard {shown} of {count:05d} missing"
            )
            continue
        candidates.append((stem, tuple(shards[i] for i in range(1, count + 1))))
    candidates.sort(key=lambda c: c[1][0].name)
    models: list[FolderModel] = []
    projectors: list[_Projector] = []
    for stem, files in candidates:
        first = files[0]
        try:
            header = read_file_header(first)
        except GGUFError as exc:
            warnings.append(f"skipped {first}: not a readable GGUF file ({exc})")
            continue
        kind = header.get("general.type")
        if "mmproj" in first.name.lower() or kind == "mmproj" or header.get("general.architecture") == "clip":
            projectors.append(_Projector(first, _int(header.get("clip.vision.projection_dim"))))
            continue
        if kind == "adapter":
            warnings.append(f"skipped {first}: a LoRA adapter (general.type = adapter), not a model")
            continue
        if not header.tensors:
            warnings.append(f"skipped {first}: it holds no tensors (a tokenizer-only file?)")
            continue
        name = _model_name(stem)
        if name is None:
            warnings.append(f"skipped {first}: {stem!r} cannot be made into a model name")
            continue
        if name != stem:
            warnings.append(
                f"{first} is served as {name!r}: model names hold no spaces or control characters"
            )
        models.append(FolderModel(name, first, files, _facts(header, files)))
    return models, projectors


def _model_name(stem: str) -> str | None:
    name = "".join(c for c in re.sub(r"\s+", "-", stem.strip()) if c.isprintable())[:MAX_NAME]
    return name if valid_name(name) else None


def _facts(header: GGUFHeader, files: tuple[Path, ...]) -> ModelFacts:
    size = 0
    for path in files:
        with contextlib.suppress(OSError):
            size += path.stat().st_size
    return ModelFacts(
        architecture=header.arch,
        layers=_int(header.arch_get("block_count")),
        trained_ctx=_int(header.arch_get("context_length")),
        embedding=_int(header.arch_get("embedding_length")),
        size_bytes=size,
    )


def _shared_prefix(a: str, b: str) -> int:
    """Length of the name prefix ``a`` and ``b`` share, up to a separator (or one of them whole)."""
    a, b = a.casefold(), b.casefold()
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if n in (len(a), len(b)):
        return n
    cut = max(a.rfind(sep, 0, n) for sep in _SEPARATORS)
    return cut + 1 if cut >= 0 else 0


def _fits(model: FolderModel, projector: _Projector) -> bool:
    return None in (model.facts.embedding, projector.width) or model.facts.embedding == projector.width


def _pair(models: list[FolderModel], projectors: list[_Projector], warnings: list[str]) -> list[FolderModel]:
    """``models`` with their projectors (see the module docstring)."""
    offers: dict[int, list[tuple[int, _Projector]]] = {}
    for projector in projectors:
        scores = [
            (_shared_prefix(m.name, projector.key), i) for i, m in enumerate(models) if _fits(m, projector)
        ]
        best = max((score for score, _ in scores), default=0)
        if best > 0:
            for score, i in scores:
                if score == best:
                    offers.setdefault(i, []).append((best, projector))
        elif len(models) == 1 and scores:
            offers.setdefault(0, []).append((0, projector))
        else:
            warnings.append(
                f"{projector.path}: a multimodal projector that no model in its folder matches by name; set "
                'mmproj = "<path>" on its model in a config file'
            )
    paired = list(models)
    for i, options in offers.items():
        options.sort(key=lambda option: (-option[0], option[1].path.name))
        chosen = options[0][1].path
        paired[i] = attrs.evolve(models[i], mmproj=chosen)
        for _, other in options[1:]:
            warnings.append(f"{other.path} is not used for {models[i].name}, which gets {chosen.name}")
    return paired
