"""The lean GGUF header reader against files written by the gguf package, and against its own reader."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from router.placement import gguf_header
from router.placement.gguf_header import GGUFError, read_header
from router.placement.synthetic import SyntheticModel, write_header_only


def _write(path: Path, build, *, endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    w = gguf.GGUFWriter(path, "llama", endianess=endianess)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _varied_strings(n: int, seed: int = 0) -> list[str]:
    """Strings of lengths 0..~300 with multi-byte characters: walking them needs every length right."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 300, n)
    return [("é" if i % 7 == 0 else "x") * int(k) + f"#{i}" for i, k in enumerate(lengths)]


def _model(w: gguf.GGUFWriter, tokens: list[str]) -> None:
    w.add_block_count(3)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv([2, 1, 2])
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("llama.flag", True)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 65535)
    w.add_int64("test.i64", -(2**40))
    w.add_uint64("test.u64", 2**63 + 1)
    w.add_float64("test.f64", 0.125)
    w.add_string("general.name", "tiny ünïcode")
    w.add_array("test.small_strings", ["a", "bc", ""])
    w.add_token_list(tokens)
    w.add_token_scores([float(i) for i in range(len(tokens))])
    w.add_token_types([1] * len(tokens))
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_uint32("test.after_arrays", 42)
    w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    q = gguf.quants.quantize(np.ones((8, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    q8 = gguf.quants.quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def test_metadata_scalars_small_arrays_and_skipped_arrays(tmp_path: Path) -> None:
    tokens = _varied_strings(3000)
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, tokens))
    h = read_header(path)

    assert h.version == 3 and not h.big_endian and h.arch == "llama"
    m = h.metadata
    assert m["llama.block_count"] == 3
    assert m["llama.attention.head_count_kv"] == (2, 1, 2)
    assert m["llama.rope.freq_base"] == 10000.0
    assert m["llama.flag"] is True
    assert (m["test.i8"], m["test.u16"], m["test.i64"], m["test.u64"]) == (-5, 65535, -(2**40), 2**63 + 1)
    assert m["test.f64"] == 0.125
    assert m["general.name"] == "tiny ünïcode"
    assert m["test.small_strings"] == ("a", "bc", "")
    assert m["test.nested"] == ((1, 2), (3,))
    # The key after three large arrays is read correctly: the skips landed exactly.
    assert m["test.after_arrays"] == 42
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert key not in m
        assert h.arrays[key].length == 3000 and not h.arrays[key].kept
    assert h.arrays["tokenizer.ggml.tokens"].element_type_name == "STRING"
    assert h.arrays["tokenizer.ggml.scores"].element_type_name == "FLOAT32"


def test_tensor_infos_match_gguf_reader(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, _varied_strings(50)))
    ours = read_header(path)
    theirs = gguf.GGUFReader(path)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert a.shape == tuple(int(d) for d in b.shape)
        assert a.ggml_type == int(b.tensor_type)
        assert a.n_bytes == int(b.n_bytes)
        assert a.offset == int(b.data_offset) - theirs.data_offset
    q = ours.tensor("blk.0.attn_q.weight")
    assert q is not None and q.type_name == "Q4_0" and q.n_bytes == 8 * 64 // 32 * 18
    assert ours.n_bytes == sum(int(t.n_bytes) for t in theirs.tensors)


def test_string_walk_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny chunk forces refills inside length fields, inside bodies, and bodies longer than a chunk."""
    tokens = [*_varied_strings(2000, seed=3), "L" * 5000, "", "z" * 777]
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, tokens))
    expected = read_header(path)
    for chunk in (13, 64, 257, 4096):
        monkeypatch.setattr(gguf_header, "CHUNK", chunk)
        h = read_header(path)
        assert dict(h.metadata) == dict(expected.metadata)
        assert h.tensors == expected.tensors
        assert h.arrays["tokenizer.ggml.tokens"].length == len(tokens)


def test_max_array_keeps_or_skips(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, ["a", "b", "c"]))
    assert read_header(path).metadata["tokenizer.ggml.tokens"] == ("a", "b", "c")
    h = read_header(path, max_array=2)
    assert "tokenizer.ggml.tokens" not in h.metadata
    assert "llama.attention.head_count_kv" not in h.metadata
    assert h.arrays["llama.attention.head_count_kv"].length == 3


def test_big_endian(tmp_path: Path) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_block_count(2)
        w.add_array("llama.attention.head_count_kv", [4, 2])
        w.add_token_list(_varied_strings(500))
        w.add_uint32("test.after", 7)
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((3, 32), dtype=np.float32))

    path = _write(tmp_path / "be.gguf", build, endianess=gguf.GGUFEndian.BIG)
    h = read_header(path)
    assert h.big_endian and h.version == 3
    assert h.metadata["llama.block_count"] == 2
    assert h.metadata["llama.attention.head_count_kv"] == (4, 2)
    assert h.metadata["test.after"] == 7
    assert h.arrays["tokenizer.ggml.tokens"].length == 500
    (t,) = h.tensors
    assert t.shape == (32, 3) and t.n_bytes == 3 * 32 * 4


def test_version_2_is_read_and_version_1_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, ["a"]))
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(data)
    assert read_header(v2).version == 2
    data[4:8] = struct.pack("<I", 1)
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(data)
    with pytest.raises(GGUFError, match="unsupported GGUF version 1"):
        read_header(v1)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "too short"),
        (b"GGML\x03\x00\x00\x00", "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00" + struct.pack("<QQ", 1, 1) + b"\x05", "truncated"),
    ],
)
def test_unreadable_files(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=match):
        read_header(path)


def test_missing_file_is_a_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="No such file"):
        read_header(tmp_path / "absent.gguf")


def test_truncated_inside_string_array(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, _varied_strings(3000)))
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(GGUFError, match="truncated"):
        read_header(cut)


def test_unknown_tensor_type(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", lambda w: _model(w, ["a"]))
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, type_at)[0] == int(gguf.GGMLQuantizationType.Q4_0)
    struct.pack_into("<I", data, type_at, 9999)
    path.write_bytes(data)
    with pytest.raises(GGUFError, match="unknown ggml tensor type 9999"):
        read_header(path)


def test_split_model_merges_all_shards(tmp_path: Path) -> None:
    model = SyntheticModel(n_layer=3)
    paths = write_header_only(tmp_path / "big.gguf", model, split_max_tensors=8)
    assert len(paths) > 1 and paths[0].name == f"big-00001-of-{len(paths):05d}.gguf"
    whole = read_header(write_header_only(tmp_path / "one.gguf", model)[0])
    for start in (paths[0], paths[-1]):
        h = read_header(start)
        assert h.paths == tuple(paths)
        assert [t.name for t in h.tensors] == [t.name for t in whole.tensors]
        assert [t.n_bytes for t in h.tensors] == [t.n_bytes for t in whole.tensors]
        assert sorted({t.shard for t in h.tensors}) == list(range(len(paths)))
        assert h.metadata["llama.block_count"] == 3


def test_split_model_with_a_missing_shard(tmp_path: Path) -> None:
    paths = write_header_only(tmp_path / "big.gguf", SyntheticModel(n_layer=3), split_max_tensors=8)
    paths[-1].unlink()
    with pytest.raises(GGUFError, match="No such file"):
        read_header(paths[0])


def test_split_count_without_shard_name(tmp_path: Path) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_uint16("split.count", 2)
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 32), dtype=np.float32))

    path = _write(tmp_path / "plain.gguf", build)
    with pytest.raises(GGUFError, match="file name does not follow"):
        read_header(path)


def test_the_reader_does_not_import_numpy() -> None:
    """Importing gguf (numpy) costs ~17 MB and ~50 ms; the reader loads only the constants module."""
    import subprocess
    import sys

    code = (
        "import sys; import router.placement.gguf_header as g; "
        "print('numpy' in sys.modules, 'gguf' in sys.modules, len(g._QUANT_SIZES) > 20)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"]
