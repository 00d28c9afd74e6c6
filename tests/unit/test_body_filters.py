"""The body transformation of a model's request filters (``set_params``, ``strip_params``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.config.values import ModelConfig
from router.frozenmap import FrozenMap
from router.http.body_filters import filter_body, filtered_for

SET = FrozenMap({"temperature": 0.2, "top_k": 40, "stop": ("</s>",), "grammar": FrozenMap({"a": (1, None)})})


def test_fields_are_set_over_the_clients_and_stripped() -> None:
    body = json.dumps({"model": "m", "temperature": 0.9, "seed": 5, "top_p": 0.5, "stream": True}).encode()
    out = json.loads(filter_body(body, SET, ("seed", "absent")))
    assert out == {
        "model": "m",
        "temperature": 0.2,
        "top_p": 0.5,
        "stream": True,
        "top_k": 40,
        "stop": ["</s>"],
        "grammar": {"a": [1, None]},
    }


def test_only_stripping_or_only_setting() -> None:
    body = b'{"model": "m", "seed": 1, "n_probs": 2}'
    assert json.loads(filter_body(body, {}, ("seed",))) == {"model": "m", "n_probs": 2}
    assert json.loads(filter_body(body, {"seed": 9}, ())) == {"model": "m", "seed": 9, "n_probs": 2}


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2]", b'"text"', b"\xff\xfe", b"--boundary\r\nContent-Disposition: form-data"],
)
def test_a_body_that_is_no_json_object_passes_unchanged(body: bytes) -> None:
    assert filter_body(body, SET, ("seed",)) is body


def test_nothing_to_do_keeps_the_very_bytes() -> None:
    body = b'{ "model" :"m",  "seed": 1 }'
    assert filter_body(body, {}, ()) is body
    plain = ModelConfig(name="m", path=Path("/m.gguf"))
    assert filtered_for(plain, body) is body
    assert filtered_for(None, body) is body


def test_the_models_own_filters_are_applied() -> None:
    model = ModelConfig(
        name="m", path=Path("/m.gguf"), set_params={"temperature": 0.1}, strip_params=("seed",)
    )
    out = json.loads(filtered_for(model, b'{"model": "m", "seed": 1, "temperature": 1}'))
    assert out == {"model": "m", "temperature": 0.1}


def test_unicode_survives_a_filtered_body() -> None:
    body = json.dumps({"prompt": "café \U0001f600", "seed": 1}, ensure_ascii=False).encode()
    assert json.loads(filter_body(body, {}, ("seed",))) == {"prompt": "café \U0001f600"}
