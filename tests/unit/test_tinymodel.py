"""Tiny random-weight llama GGUF models: file contents, and that the real llama-server runs them."""

from __future__ import annotations

from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from router.cli.tinymodel import TinyShape, VocabNotFound, main, write_tiny_model
from tests.support.realenv import require_vocab_dir, running_llama_server, tiny_model

SPECIAL = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
WORDS = ["▁the", "▁a", "▁hello", "▁world", "ing", "ed", "▁é", "▁日本"]


@pytest.fixture(scope="module")
def fake_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SentencePiece-style vocab file, written the way llama.cpp's vocab files are laid out."""
    directory = tmp_path_factory.mktemp("vocab")
    writer = gguf.GGUFWriter(directory / "ggml-vocab-mini.gguf", "llama")
    tokens = SPECIAL + BYTES + WORDS
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(SPECIAL) + [0.0] * 256 + [-float(i) for i in range(len(WORDS))])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(WORDS))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return directory


def read(path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def scalar(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_header_matches_shape(tmp_path: Path, fake_vocab_dir: Path) -> None:
    shape = TinyShape(n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=160, n_ctx_train=512, vocab="mini")
    reader = read(write_tiny_model(tmp_path / "m.gguf", shape, fake_vocab_dir))
    n_vocab = len(SPECIAL) + 256 + len(WORDS)
    assert scalar(reader, "general.architecture") == "llama"
    assert scalar(reader, "llama.embedding_length") == 96
    assert scalar(reader, "llama.block_count") == 3
    assert scalar(reader, "llama.attention.head_count") == 6
    assert scalar(reader, "llama.attention.head_count_kv") == 2
    assert scalar(reader, "llama.feed_forward_length") == 160
    assert scalar(reader, "llama.context_length") == 512
    assert scalar(reader, "llama.rope.dimension_count") == 16
    assert scalar(reader, "llama.vocab_size") == n_vocab
    assert scalar(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32


def test_tensors_have_llama_names_and_shapes(tmp_path: Path, fake_vocab_dir: Path) -> None:
    shape = TinyShape(n_embd=64, n_layer=2, n_head=4, n_head_kv=1, n_ff=96, vocab="mini")
    reader = read(write_tiny_model(tmp_path / "m.gguf", shape, fake_vocab_dir))
    n_vocab = len(SPECIAL) + 256 + len(WORDS)
    # ggml order: the first dimension is the row length (input width).
    expected = {
        "token_embd.weight": [64, n_vocab],
        "output_norm.weight": [64],
        "output.weight": [64, n_vocab],
    }
    for i in range(2):
        expected |= {
            f"blk.{i}.attn_norm.weight": [64],
            f"blk.{i}.attn_q.weight": [64, 64],
            f"blk.{i}.attn_k.weight": [64, 16],
            f"blk.{i}.attn_v.weight": [64, 16],
            f"blk.{i}.attn_output.weight": [64, 64],
            f"blk.{i}.ffn_norm.weight": [64],
            f"blk.{i}.ffn_gate.weight": [64, 96],
            f"blk.{i}.ffn_up.weight": [64, 96],
            f"blk.{i}.ffn_down.weight": [96, 64],
        }
    actual = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    assert actual == expected
    for t in reader.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        if t.name.endswith("norm.weight"):
            assert np.all(t.data == 1.0)
        else:
            assert 0.0 < float(np.std(t.data)) < 2.0


def test_tokenizer_is_copied_from_the_vocab_file(tmp_path: Path, fake_vocab_dir: Path) -> None:
    reader = read(write_tiny_model(tmp_path / "m.gguf", TinyShape(vocab="mini"), fake_vocab_dir))
    assert reader.fields["tokenizer.ggml.tokens"].contents() == SPECIAL + BYTES + WORDS
    assert scalar(reader, "tokenizer.ggml.model") == "llama"
    assert scalar(reader, "tokenizer.ggml.pre") == "default"
    assert scalar(reader, "tokenizer.ggml.bos_token_id") == 1
    assert scalar(reader, "tokenizer.ggml.eos_token_id") == 2
    assert scalar(reader, "tokenizer.ggml.add_bos_token") is True
    assert reader.fields["tokenizer.ggml.token_type"].contents()[:4] == [2, 3, 3, 6]
    assert reader.fields["tokenizer.ggml.scores"].contents()[-1] == -float(len(WORDS) - 1)


@pytest.mark.parametrize(
    ("dtype", "ggml_type", "file_type"),
    [
        ("f16", gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
        ("bf16", gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
        ("q8_0", gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        ("q4_0", gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    ],
)
def test_weight_types(
    tmp_path: Path,
    fake_vocab_dir: Path,
    dtype: str,
    ggml_type: gguf.GGMLQuantizationType,
    file_type: gguf.LlamaFileType,
) -> None:
    reader = read(write_tiny_model(tmp_path / "m.gguf", TinyShape(dtype=dtype, vocab="mini"), fake_vocab_dir))
    assert scalar(reader, "general.file_type") == file_type
    for t in reader.tensors:
        want = gguf.GGMLQuantizationType.F32 if t.name.endswith("norm.weight") else ggml_type
        assert t.tensor_type == want, t.name
        block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        assert int(t.n_bytes) == int(t.n_elements) // block * type_size


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path, fake_vocab_dir: Path) -> None:
    a = write_tiny_model(tmp_path / "a.gguf", TinyShape(vocab="mini", seed=7), fake_vocab_dir)
    b = write_tiny_model(tmp_path / "b.gguf", TinyShape(vocab="mini", seed=7), fake_vocab_dir)
    c = write_tiny_model(tmp_path / "c.gguf", TinyShape(vocab="mini", seed=8), fake_vocab_dir)
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size == c.stat().st_size
    assert a.read_bytes() != c.read_bytes()


def test_tied_output_leaves_out_the_output_matrix(tmp_path: Path, fake_vocab_dir: Path) -> None:
    shape = TinyShape(vocab="mini", tie_output=True)
    names = {t.name for t in read(write_tiny_model(tmp_path / "m.gguf", shape, fake_vocab_dir)).tensors}
    assert "output.weight" not in names
    assert "token_embd.weight" in names
    assert "output_norm.weight" in names


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_head": 3},  # 64 is not a multiple of 3
        {"n_head_kv": 3},  # 4 heads cannot share 3 KV heads
        {"n_embd": 72, "n_head": 12, "dtype": "q8_0"},  # 72 is not a multiple of the q8_0 block of 32
        {"n_embd": 20, "n_head": 4},  # odd head size 5
        {"n_layer": 0},
        {"dtype": "q4_k"},
    ],
)
def test_invalid_shapes_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TinyShape(**kwargs)  # type: ignore[arg-type]


def test_missing_vocab_names_the_available_ones(tmp_path: Path, fake_vocab_dir: Path) -> None:
    with pytest.raises(VocabNotFound, match="available: mini"):
        write_tiny_model(tmp_path / "m.gguf", TinyShape(vocab="nope"), fake_vocab_dir)
    assert not (tmp_path / "m.gguf").exists()
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_the_model(
    tmp_path: Path, fake_vocab_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "cli.gguf"
    argv = [str(out), "--embd", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ff", "64"]
    argv += ["--ctx-train", "256", "--dtype", "f16", "--vocab", "mini", "--seed", "3"]
    argv += ["--vocab-dir", str(fake_vocab_dir)]
    assert main(argv) == 0
    assert str(out) in capsys.readouterr().out
    reader = read(out)
    assert scalar(reader, "llama.embedding_length") == 32
    assert scalar(reader, "llama.block_count") == 1
    assert scalar(reader, "llama.context_length") == 256
    assert scalar(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    expected = TinyShape(
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_head_kv=1,
        n_ff=64,
        n_ctx_train=256,
        dtype="f16",
        vocab="mini",
        seed=3,
    )
    assert out.read_bytes() == write_tiny_model(tmp_path / "api.gguf", expected, fake_vocab_dir).read_bytes()


def test_cli_reports_bad_shapes(tmp_path: Path, fake_vocab_dir: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            [str(tmp_path / "x.gguf"), "--heads", "5", "--vocab-dir", str(fake_vocab_dir), "--vocab", "mini"]
        )
    assert info.value.code == 2


def test_default_model_with_the_real_vocab_is_small(tmp_path: Path) -> None:
    directory = require_vocab_dir()
    path = write_tiny_model(tmp_path / "m.gguf", TinyShape(), directory)
    reader = read(path)
    assert scalar(reader, "llama.vocab_size") == 32000
    assert scalar(reader, "tokenizer.ggml.model") == "llama"
    assert path.stat().st_size < 20 * 2**20


def completion(base_url: str, prompt: str, n_predict: int = 8) -> dict[str, object]:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": True}
    reply = httpx.post(f"{base_url}/completion", json=body, timeout=60.0)
    reply.raise_for_status()
    result: dict[str, object] = reply.json()
    return result


@pytest.mark.real
def test_real_llama_server_loads_and_answers() -> None:
    with running_llama_server(tiny_model()) as server:
        prompt = "The quick brown fox jumps over the lazy dog because"
        first = completion(server.url, prompt)
        timings = first["timings"]
        assert isinstance(timings, dict)
        assert timings["predicted_n"] == first["tokens_predicted"] == 8
        assert timings["prompt_n"] > 5
        assert isinstance(first["content"], str)
        second = completion(server.url, prompt)
        assert second["content"] == first["content"]  # greedy decoding of a fixed model
        assert second["timings"]["cache_n"] > 0  # type: ignore[index]


@pytest.mark.real
@pytest.mark.parametrize(
    "shape",
    [
        TinyShape(dtype="f16", n_head_kv=4),
        TinyShape(dtype="q8_0", n_embd=128, n_head=8, n_head_kv=2, n_ff=256),
        TinyShape(dtype="q4_0", tie_output=True),
    ],
    ids=["f16-mha", "q8_0-gqa", "q4_0-tied"],
)
def test_real_llama_server_runs_other_shapes(shape: TinyShape) -> None:
    with running_llama_server(tiny_model(shape), ctx=512, slots=1) as server:
        result = completion(server.url, "Hello world", n_predict=4)
        assert result["tokens_predicted"] == 4
        props = httpx.get(f"{server.url}/props", timeout=10.0).json()
        assert props["default_generation_settings"]["n_ctx"] == 512
