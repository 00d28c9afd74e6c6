"""The model keys that shape a replica and its requests: ``llama_server``, ``env``, ``set_params`` and
``strip_params`` — their values, their [defaults], and the refusals that name the key, the value and the
fix."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from router.config.llama_args import gpu_env
from router.config.load import config_from_dict
from router.config.model_extras import MASKING_VARIABLES, RESERVED_FIELDS, thawed_json
from router.deploy.masking import BACKENDS, Masks
from router.frozenmap import FrozenMap
from tests.unit.config_builders import FILE, build, error_of, setter


def test_the_four_keys_are_read_and_frozen() -> None:
    config = build(
        setter(
            "models.qwen",
            {
                "model": "/models/qwen.gguf",
                "parallel": 4,
                "llama_server": "/opt/vk/bin/llama-server",
                "env": {"GGML_VK_PREFER_HOST_MEMORY": "1", "OMP_NUM_THREADS": 8},
                "set_params": {"temperature": 0.2, "top_k": 40, "logit_bias": {"15043": [1, 2]}},
                "strip_params": ["seed"],
            },
        )
    )
    qwen, small = config.models["qwen"], config.models["small"]
    assert qwen.llama_server == "/opt/vk/bin/llama-server"
    assert qwen.env == {"GGML_VK_PREFER_HOST_MEMORY": "1", "OMP_NUM_THREADS": "8"}  # an integer: its digits
    assert qwen.set_params["logit_bias"] == FrozenMap({"15043": (1, 2)})
    assert thawed_json(qwen.set_params) == {"temperature": 0.2, "top_k": 40, "logit_bias": {"15043": [1, 2]}}
    assert qwen.strip_params == ("seed",) and qwen.filters_body
    hash(qwen)  # a configuration stays hashable
    assert small.llama_server is None and small.env == {} and small.set_params == {}
    assert small.strip_params == () and not small.filters_body


def test_a_relative_binary_starts_at_the_config_directory_and_a_bare_name_stays(tmp_path: Path) -> None:
    doc = {"models": {"a": {"model": "a.gguf", "llama_server": "vk/llama-server"}}}
    doc["models"]["b"] = {"model": "b.gguf", "llama_server": "llama-server-vulkan"}
    config = config_from_dict(doc, tmp_path / "c.toml", base_dir=tmp_path)
    assert config.models["a"].llama_server == str(tmp_path / "vk" / "llama-server")
    assert config.models["b"].llama_server == "llama-server-vulkan"


def test_defaults_give_env_and_filters_to_every_model_that_sets_none() -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {
            "env": {"A": "1"},
            "set_params": {"temperature": 0.1},
            "strip_params": ["seed"],
            "flash-attn": "on",
        }
        data["models"]["qwen"]["env"] = {"B": "2"}  # replaces the default's table whole
        data["models"]["qwen"]["strip_params"] = []  # an empty list clears the default's

    config = build(change)
    qwen, small = config.models["qwen"], config.models["small"]
    assert qwen.env == {"B": "2"} and qwen.strip_params == () and qwen.set_params == {"temperature": 0.1}
    assert small.env == {"A": "1"} and small.strip_params == ("seed",)
    assert dict(config.defaults) == {"flash-attn": "on"}  # the model keys are no llama-server flags


def test_json_and_toml_give_the_same_values(tmp_path: Path) -> None:
    text = (
        '[models.a]\nmodel = "a.gguf"\nenv = { X = "1" }\nstrip_params = ["seed"]\n'
        'set_params = { temperature = 0.2, stop = ["</s>"], grammar_opts = { strict = true } }\n'
    )
    from_toml = config_from_dict(tomllib.loads(text), "c")
    from_json = config_from_dict(json.loads(json.dumps(tomllib.loads(text))), "c")
    assert from_toml == from_json


# (key, value, the value as the message shows it, words of the fix)
REFUSED = [
    ("models.qwen.set_params", 3, "3", "must be a table of request fields"),
    ("models.qwen.set_params", ["temperature"], '["temperature"]', "must be a table"),
    ("models.qwen.strip_params", "seed", '"seed"', 'must be a list of request field names, e.g. ["top_k"'),
    ("models.qwen.strip_params", ["seed", 3], '["seed", 3]', "must be a list of request field names"),
    ("models.qwen.strip_params", ["seed", "seed"], '["seed", "seed"]', "list each field once"),
    ("models.qwen.env", "A=1", '"A=1"', "must be a table of variable names and strings"),
    ("models.qwen.llama_server", "", '""', "must be a non-empty path string"),
    ("models.qwen.llama_server", 5, "5", "the llama-server binary of this model"),
    ("defaults.set_params", "x", '"x"', "must be a table"),
    ("defaults.env", ["A"], '["A"]', "must be a table"),
    ("defaults.llama_server", "/x", '"/x"', "set router.llama_server for every model"),
]


@pytest.mark.parametrize(("key", "value", "shown", "fix"), REFUSED)
def test_bad_values_are_refused_naming_key_value_and_fix(key: str, value: Any, shown: str, fix: str) -> None:
    message = str(error_of(setter(key, value)))
    assert message.startswith(f"config error in {FILE}: {key} = {shown} is invalid: "), message
    assert fix in message


@pytest.mark.parametrize("field", RESERVED_FIELDS)
@pytest.mark.parametrize("where", ["models.qwen", "defaults"])
def test_fields_the_router_reads_are_neither_set_nor_stripped(field: str, where: str) -> None:
    error = error_of(setter(f"{where}.set_params", {field: "x"}))
    assert error.key == f"{where}.set_params.{field}"
    shown = f'{where}.set_params.{field} = "x" is invalid'
    assert f"{shown}: the router reads the field '{field}'" in str(error)
    assert f"remove '{field}'" in str(error)
    error = error_of(setter(f"{where}.strip_params", ["seed", field]))
    assert error.key == f"{where}.strip_params"
    assert f'["seed", "{field}"] is invalid: the router reads the field' in str(error)


def test_a_field_both_set_and_stripped_is_refused() -> None:
    def change(data: dict[str, Any]) -> None:
        data["models"]["qwen"]["set_params"] = {"seed": 1}
        data["models"]["qwen"]["strip_params"] = ["top_k", "seed"]

    assert str(error_of(change)) == (
        f'config error in {FILE}: models.qwen.strip_params = ["top_k", "seed"] is invalid: \'seed\' is also '
        "in models.qwen.set_params; a field is either set or stripped: remove it from one of them"
    )

    def from_defaults(data: dict[str, Any]) -> None:
        data["defaults"] = {"strip_params": ["seed"]}
        data["models"]["qwen"]["set_params"] = {"seed": 1}

    message = str(error_of(from_defaults))
    assert 'defaults.strip_params = ["seed"] is invalid: ' in message
    assert "'seed' is also in models.qwen.set_params" in message
    assert "an empty one clears it" in message


def test_set_params_values_must_be_json() -> None:
    error = error_of(setter("models.qwen.set_params", {"when": tomllib.loads("d = 2024-01-01")["d"]}))
    assert error.key == "models.qwen.set_params.when"
    assert "must be a JSON value" in str(error) and "no dates" in str(error)
    error = error_of(setter("models.qwen.set_params", {"t": float("inf")}))
    assert error.key == "models.qwen.set_params.t"


@pytest.mark.parametrize("name", MASKING_VARIABLES)
def test_the_routers_gpu_masks_cannot_be_set(name: str) -> None:
    error = error_of(setter("models.qwen.env", {"OK": "1", name: "0"}))
    assert error.key == f"models.qwen.env.{name}"
    assert str(error) == (
        f'config error in {FILE}: models.qwen.env.{name} = "0" is invalid: the router sets the GPU masks of '
        "every replica itself (each sees only its model's GPUs); choose the GPUs with the model's `gpus` key "
        "and remove this variable"
    )
    assert error_of(setter("defaults.env", {name: "0"})).key == f"defaults.env.{name}"


def test_every_variable_the_router_masks_with_is_refused() -> None:
    """The list of refused variables keeps up with what the router sets on its replicas."""
    set_by_router = set(gpu_env([0, 1])) | set(BACKENDS.values())
    set_by_router |= set(Masks({"Vulkan": {0: 1}, "SYCL": {0: 0}}).env([0]))
    assert set_by_router <= set(MASKING_VARIABLES)


@pytest.mark.parametrize(
    ("name", "value", "fix"),
    [
        ("LLAMA_ARG_API_KEY", "x", "llama-server reads this variable as a flag"),
        ("LLAMA_API_KEY", "x", "write the flag as a key of the model's table"),
        ("1ST", "x", "letters, digits and _"),
        ("A-B", "x", "letters, digits and _"),
        ("A", 1.5, 'must be a string (quote it: NAME = "1")'),
        ("A", True, "must be a string"),
        ("A", ["x"], "must be a string"),
    ],
)
def test_bad_env_entries_are_refused(name: str, value: Any, fix: str) -> None:
    error = error_of(setter("models.qwen.env", {name: value}))
    assert error.key == f"models.qwen.env.{name}"
    assert fix in str(error)
