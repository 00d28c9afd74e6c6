"""A lean reader for GGUF headers: metadata key/values and tensor infos, nothing else.

Placement needs the model's hyper-parameters and the size of every tensor, never the tensor data and never
the tokenizer. A GGUF header of a model with a 128k-token vocabulary carries several hundred thousand
strings (tokens, merges) and as many floats and ints (scores, token types); materialising them costs seconds
and hundreds of megabytes. This reader keeps only small values:

* scalars, strings and arrays of at most ``max_array`` elements go into ``GGUFHeader.metadata``;
* every array, small or large, has its element type and length in ``GGUFHeader.arrays``;
* large numeric arrays are skipped with a seek; large string arrays are walked length by length over big
  raw chunks, without building a single Python string.

The file is read through a private 1 MiB chunk buffer; it is never mapped, and the data section is never
touched. Versions 2 and 3 are supported, little- and big-endian. A sharded model (``split.count`` > 1,
files named ``NAME-00001-of-00003.gguf``) is read shard by shard and the tensor infos are merged.

The ggml type sizes come from the ``gguf`` package's constants module. That module is loaded on its own,
without the package's ``__init__`` (which pulls in numpy, ~17 MB of memory and ~50 ms), unless the package is
already imported.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import struct
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import attrs

__all__ = [
    "ArrayInfo",
    "GGUFError",
    "GGUFHeader",
    "TensorInfo",
    "ggml_type_name",
    "ggml_type_size",
    "read_file_header",
    "read_header",
    "shard_paths",
]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
CHUNK = 1 << 20
MAX_ARRAY_DEFAULT = 1024
# Sanity limits: a corrupt header must fail fast, not allocate gigabytes.
MAX_KEY_BYTES = 1 << 16
MAX_COUNT = 1 << 40
MAX_DIMS = 8


class GGUFError(ValueError):
    """The file is not a readable GGUF file (bad magic, unsupported version, truncated, corrupt)."""


def _load_constants() -> types.ModuleType:
    """The ``gguf.constants`` module, without importing numpy when the package is not imported yet."""
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    try:
        spec = importlib.util.find_spec("gguf")
        locations = spec.submodule_search_locations if spec is not None else None
        if locations:
            path = os.path.join(next(iter(locations)), "constants.py")
            mod_spec = importlib.util.spec_from_file_location("_router_gguf_constants", path)
            if mod_spec is not None and mod_spec.loader is not None:
                module = importlib.util.module_from_spec(mod_spec)
                mod_spec.loader.exec_module(module)
                return module
    except (ImportError, OSError, SyntaxError):
        pass
    import gguf.constants

    return gguf.constants


_C = _load_constants()
_QUANT_SIZES: dict[int, tuple[int, int]] = {int(k): v for k, v in _C.GGML_QUANT_SIZES.items()}
_TYPE_NAMES: dict[int, str] = {int(t): t.name for t in _C.GGMLQuantizationType}


def ggml_type_name(ggml_type: int) -> str:
    """The ggml type's name (``Q4_K``), or ``type<N>`` for a type this ``gguf`` package does not know."""
    return _TYPE_NAMES.get(ggml_type, f"type{ggml_type}")


def ggml_type_size(ggml_type: int) -> tuple[int, int]:
    """(block size in elements, bytes per block) for a ggml type; GGUFError for an unknown type."""
    try:
        return _QUANT_SIZES[ggml_type]
    except KeyError:
        raise GGUFError(f"unknown ggml tensor type {ggml_type}") from None


# GGUF value types (gguf.GGUFValueType): id -> struct format of one element; strings and arrays are None.
_V_UINT8, _V_INT8, _V_UINT16, _V_INT16, _V_UINT32, _V_INT32, _V_FLOAT32, _V_BOOL = range(8)
_V_STRING, _V_ARRAY, _V_UINT64, _V_INT64, _V_FLOAT64 = 8, 9, 10, 11, 12
_SCALAR_FMT: dict[int, str] = {
    _V_UINT8: "B",
    _V_INT8: "b",
    _V_UINT16: "H",
    _V_INT16: "h",
    _V_UINT32: "I",
    _V_INT32: "i",
    _V_FLOAT32: "f",
    _V_BOOL: "?",
    _V_UINT64: "Q",
    _V_INT64: "q",
    _V_FLOAT64: "d",
}
_VALUE_TYPE_NAMES: dict[int, str] = {int(t): t.name for t in _C.GGUFValueType}

MetaValue = int | float | bool | str | tuple[Any, ...]


@attrs.frozen
class ArrayInfo:
    """An array-valued key: its element type (``gguf.GGUFValueType`` id and name) and length."""

    element_type: int
    length: int
    kept: bool  # True when the values are in GGUFHeader.metadata

    @property
    def element_type_name(self) -> str:
        return _VALUE_TYPE_NAMES.get(self.element_type, f"type{self.element_type}")


@attrs.frozen
class TensorInfo:
    """One tensor: name, shape in ggml order (ne[0] first), ggml type, data offset and size in bytes.

    ``offset`` is relative to the start of its shard's data section, as stored in the file; ``shard`` is the
    0-based index of the file holding it.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    n_bytes: int
    shard: int = 0

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@attrs.frozen(eq=False)
class GGUFHeader:
    """What placement needs from a GGUF file (or from all shards of a split model).

    ``metadata`` maps each key to its value: scalars as Python scalars, small arrays as tuples. Keys whose
    arrays were too large to keep are absent from ``metadata`` but present in ``arrays``. For a split
    model, the metadata is the first shard's and ``tensors`` holds the tensors of every shard.
    """

    paths: tuple[Path, ...]
    version: int
    big_endian: bool
    alignment: int
    metadata: Mapping[str, MetaValue]
    arrays: Mapping[str, ArrayInfo]
    tensors: tuple[TensorInfo, ...]

    @property
    def path(self) -> Path:
        return self.paths[0]

    @property
    def arch(self) -> str:
        """``general.architecture`` (``"llama"`` when absent, as llama.cpp's oldest files assume)."""
        value = self.metadata.get("general.architecture", "llama")
        return value if isinstance(value, str) else str(value)

    @property
    def n_bytes(self) -> int:
        """Bytes of tensor data over all tensors."""
        return sum(t.n_bytes for t in self.tensors)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """The value of ``{arch}.{suffix}``."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None


class _Reader:
    """Sequential reads over a file through one reusable chunk; skips seek without reading."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self._f = f
        self._path = path
        self._buf = b""
        self._pos = 0  # position inside _buf
        self._base = 0  # file offset of _buf[0]
        self.endian = "<"
        self._u32 = struct.Struct("<I")
        self._u64 = struct.Struct("<Q")

    def set_endian(self, endian: str) -> None:
        self.endian = endian
        self._u32 = struct.Struct(endian + "I")
        self._u64 = struct.Struct(endian + "Q")

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def _fill(self, n: int) -> None:
        """Make at least n bytes available at _pos, or raise GGUFError at end of file."""
        if self._pos + n <= len(self._buf):
            return
        start = self._base + self._pos
        rest = self._buf[self._pos :]
        self._f.seek(start + len(rest))
        more = self._f.read(max(CHUNK, n - len(rest)))
        self._buf = rest + more
        self._base = start
        self._pos = 0
        if len(self._buf) < n:
            raise GGUFError(f"{self._path}: truncated header at byte {start + len(self._buf)}")

    def read(self, n: int) -> bytes:
        self._fill(n)
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def u32(self) -> int:
        self._fill(4)
        (v,) = self._u32.unpack_from(self._buf, self._pos)
        self._pos += 4
        return int(v)

    def u64(self) -> int:
        self._fill(8)
        (v,) = self._u64.unpack_from(self._buf, self._pos)
        self._pos += 8
        return int(v)

    def count(self, what: str) -> int:
        n = self.u64()
        if n > MAX_COUNT:
            raise GGUFError(f"{self._path}: implausible {what} {n} at byte {self.offset - 8}")
        return n

    def string(self) -> str:
        n = self.count("string length")
        return self.read(n).decode("utf-8", errors="replace")

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALAR_FMT[vtype]
        size = struct.calcsize(fmt)
        self._fill(size)
        (v,) = struct.unpack_from(self.endian + fmt, self._buf, self._pos)
        self._pos += size
        return v

    def numbers(self, vtype: int, n: int) -> tuple[Any, ...]:
        fmt = _SCALAR_FMT[vtype]
        size = struct.calcsize(fmt) * n
        self._fill(size)
        out = struct.unpack_from(f"{self.endian}{n}{fmt}", self._buf, self._pos)
        self._pos += size
        return out

    def skip(self, n: int) -> None:
        """Move forward n bytes; beyond the chunk this is a seek, no read."""
        if self._pos + n <= len(self._buf):
            self._pos += n
            return
        target = self._base + self._pos + n
        self._buf = b""
        self._base = target
        self._pos = 0

    def skip_strings(self, n: int) -> None:
        """Skip n length-prefixed strings, scanning the lengths over raw chunks."""
        unpack = self._u64.unpack_from
        while n > 0:
            buf = self._buf
            pos = self._pos
            # Walk the length fields inside the chunk; a body may run past its end (skipped by offset).
            # unpack_from raises struct.error at the first length field not wholly inside the chunk, which
            # is the bounds check: cheaper than comparing on every iteration (~30% on a 400k-string header).
            done = n
            i = 0
            try:
                for i in range(n):  # noqa: B007 - i is read in the handler
                    pos += 8 + unpack(buf, pos)[0]
            except struct.error:
                done = i
            n -= done
            if pos > len(buf):
                self._base += pos
                self._buf = b""
                self._pos = 0
            else:
                self._pos = pos
            if n > 0:
                self._fill(8)


def _read_value(r: _Reader, vtype: int, max_array: int, key: str, arrays: dict[str, ArrayInfo]) -> Any:
    """Read one value; returns _SKIPPED for an array too large to keep."""
    if vtype in _SCALAR_FMT:
        return r.scalar(vtype)
    if vtype == _V_STRING:
        return r.string()
    if vtype != _V_ARRAY:
        raise GGUFError(f"{r._path}: key {key!r} has unknown value type {vtype}")
    etype = r.u32()
    n = r.count(f"array length of {key!r}")
    keep = n <= max_array
    arrays[key] = ArrayInfo(element_type=etype, length=n, kept=keep)
    if etype in _SCALAR_FMT:
        if keep:
            return r.numbers(etype, n)
        r.skip(n * struct.calcsize(_SCALAR_FMT[etype]))
        return _SKIPPED
    if etype == _V_STRING:
        if keep:
            return tuple(r.string() for _ in range(n))
        r.skip_strings(n)
        return _SKIPPED
    if etype == _V_ARRAY:
        nested: dict[str, ArrayInfo] = {}
        items = [_read_value(r, _V_ARRAY, max_array if keep else -1, key, nested) for _ in range(n)]
        return tuple(items) if keep and _SKIPPED not in items else _SKIPPED
    raise GGUFError(f"{r._path}: array {key!r} has unknown element type {etype}")


_SKIPPED: Any = object()


def _read_one(path: Path, shard: int, max_array: int) -> GGUFHeader:
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below; our own chunking replaces buffering
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror or e}") from e
    with f:
        r = _Reader(f, path)
        try:
            magic = r.read(4)
        except GGUFError:
            raise GGUFError(f"{path}: not a GGUF file (too short)") from None
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (magic {magic!r})")
        raw_version = r.read(4)
        version = struct.unpack("<I", raw_version)[0]
        big_endian = False
        if version & 0xFFFF == 0 and version != 0:
            # The version reads as a huge number little-endian: the file was written big-endian.
            version = struct.unpack(">I", raw_version)[0]
            big_endian = True
            r.set_endian(">")
        if version not in (2, 3):
            raise GGUFError(f"{path}: unsupported GGUF version {version} (2 and 3 are supported)")
        n_tensors = r.count("tensor count")
        n_kv = r.count("key/value count")

        metadata: dict[str, MetaValue] = {}
        arrays: dict[str, ArrayInfo] = {}
        for _ in range(n_kv):
            klen = r.count("key length")
            if klen > MAX_KEY_BYTES:
                raise GGUFError(f"{path}: implausible key length {klen}")
            key = r.read(klen).decode("utf-8", errors="replace")
            vtype = r.u32()
            value = _read_value(r, vtype, max_array, key, arrays)
            if value is not _SKIPPED:
                metadata[key] = value

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{path}: general.alignment {alignment!r} is not a power of two")

        tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.u32()
            if n_dims > MAX_DIMS:
                raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions")
            shape = tuple(int(d) for d in r.numbers(_V_UINT64, n_dims)) if n_dims else ()
            ggml_type = r.u32()
            offset = r.u64()
            block, type_size = ggml_type_size(ggml_type)
            n_elements = math.prod(shape)
            if shape and shape[0] % block:
                raise GGUFError(
                    f"{path}: tensor {name!r} row of {shape[0]} is not a multiple of the "
                    f"{ggml_type_name(ggml_type)} block size {block}"
                )
            tensors.append(TensorInfo(name, shape, ggml_type, offset, n_elements // block * type_size, shard))

    return GGUFHeader(
        paths=(path,),
        version=version,
        big_endian=big_endian,
        alignment=alignment,
        metadata=types.MappingProxyType(metadata),
        arrays=types.MappingProxyType(arrays),
        tensors=tuple(tensors),
    )


_SHARD_RE = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_paths(path: Path, count: int) -> tuple[Path, ...]:
    """All shard paths of a split model given any one of them (``NAME-0000i-of-0000N.gguf``)."""
    m = _SHARD_RE.match(path.name)
    if m is None:
        raise GGUFError(
            f"{path}: split.count is {count} but the file name does not follow NAME-00001-of-{count:05d}.gguf"
        )
    stem = m.group("stem")
    return tuple(path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))


def read_file_header(path: str | os.PathLike[str], *, max_array: int = MAX_ARRAY_DEFAULT) -> GGUFHeader:
    """The header of this one file, without following ``split.count`` to the other shards."""
    return _read_one(Path(path), 0, max_array)


def read_header(path: str | os.PathLike[str], *, max_array: int = MAX_ARRAY_DEFAULT) -> GGUFHeader:
    """Read the header of a GGUF file, following ``split.count`` to every shard.

    Raises GGUFError (a ValueError) for any file that cannot be read as GGUF: missing, unreadable,
    truncated, wrong magic, unsupported version, unknown tensor type, missing shard.
    """
    p = Path(path)
    first = _read_one(p, 0, max_array)
    count = first.metadata.get("split.count", 1)
    if not isinstance(count, int) or count <= 1:
        return first
    paths = shard_paths(p, count)
    headers: list[GGUFHeader] = []
    for i, shard_path in enumerate(paths):
        if shard_path == p:
            h = attrs.evolve(first, tensors=tuple(attrs.evolve(t, shard=i) for t in first.tensors))
        else:
            h = _read_one(shard_path, i, max_array)
        headers.append(h)
    lead = headers[0]
    tensors = tuple(t for h in headers for t in h.tensors)
    expected = lead.metadata.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(tensors):
        raise GGUFError(f"{p}: split.tensors.count is {expected} but the shards hold {len(tensors)} tensors")
    return attrs.evolve(lead, paths=paths, tensors=tensors)
