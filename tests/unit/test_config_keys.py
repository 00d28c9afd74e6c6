"""``[keys.NAME]`` and the ``max_wait_*`` keys: what loads, what the scheduler is given, and every mistake
refused with one line that names the key and never shows a secret."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from router.config.key_specs import CLASSES
from router.config.load import ConfigError, load_config, read_api_keys
from router.deploy.launch import scheduler_settings
from statemachine import RequestClass
from tests.unit.config_builders import FILE, build, error_of, setter

SECRET = "sk-never-shown-4711"


def with_keys(**keys: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["keys"] = keys

    return change


def test_a_named_key_loads_with_its_defaults_and_its_values() -> None:
    config = build(
        with_keys(
            alice={
                "key": SECRET,
                "class": "interactive",
                "weight": 2,
                "models": ["qwen*", "chat"],
                "admin": True,
            },
            bob={
                "key_env": "BOB_KEY",
                "requests_per_minute": 120,
                "tokens_per_day": 2000000,
                "max_queued": 50,
            },
        ),
        env={"BOB_KEY": " sk-bob \n"},
    )
    alice, bob = config.keys["alice"], config.keys["bob"]
    assert (alice.secret, alice.klass, alice.weight, alice.models, alice.admin) == (
        SECRET,
        "interactive",
        2,
        ("qwen*", "chat"),
        True,
    )
    assert (bob.secret, bob.klass, bob.weight, bob.models, bob.admin, bob.key_env) == (
        "sk-bob",
        "standard",
        1,
        None,
        False,
        "BOB_KEY",
    )
    assert (bob.requests_per_minute, bob.tokens_per_day, bob.max_queued) == (120, 2000000, 50)
    assert SECRET not in repr(config) and "sk-bob" not in repr(config)


def test_the_classes_are_the_schedulers() -> None:
    assert tuple(c.label for c in RequestClass) == CLASSES


def test_a_key_file_gives_its_first_non_empty_line(tmp_path: Path) -> None:
    (tmp_path / "alice.key").write_text("\n  sk-from-file  \nsecond line\n")
    path = tmp_path / "router.toml"
    path.write_text('[keys.alice]\nkey_file = "alice.key"\n[models.a]\nmodel = "a.gguf"\n')
    config = load_config(path, env={})
    assert config.keys["alice"].secret == "sk-from-file"
    assert config.keys["alice"].key_file == tmp_path / "alice.key"


def test_weights_and_waits_reach_the_scheduler() -> None:
    config = build(
        lambda data: (
            with_keys(alice={"key": "a", "weight": 3}, bob={"key": "b"})(data),
            data["router"].update(max_wait_interactive=5, max_wait_standard=60.5, max_wait_batch=900),
        )
    )
    settings = scheduler_settings(config, (0, 1), {}, {0: None, 1: None})
    assert dict(settings.weights) == {"alice": 3, "bob": 1}
    assert settings.policy.max_wait == (5.0, 60.5, 900.0)
    assert scheduler_settings(build(), (0, 1), {}, {}).policy.max_wait == (30.0, 120.0, 600.0)


# (the key's table, the environment, the dotted key the message names, words it holds)
BAD_KEYS: list[tuple[dict[str, Any], dict[str, str], str, str]] = [
    (
        {"key": SECRET, "class": "urgent"},
        {},
        'keys.alice.class = "urgent" is invalid',
        '"interactive", "standard"',
    ),
    ({"key": SECRET, "weight": 0}, {}, "keys.alice.weight = 0 is invalid", "an integer >= 1"),
    ({"key": SECRET, "weight": 1.5}, {}, "keys.alice.weight = 1.5 is invalid", "an integer >= 1"),
    (
        {"key": SECRET, "models": ["nope-*"]},
        {},
        'keys.alice.models = ["nope-*"] is invalid',
        "'nope-*' matches no",
    ),
    (
        {"key": SECRET, "models": "qwen"},
        {},
        'keys.alice.models = "qwen" is invalid',
        "a list of non-empty globs",
    ),
    ({"key": SECRET, "admin": "yes"}, {}, 'keys.alice.admin = "yes" is invalid', "true or false"),
    ({"key": SECRET, "requests_per_minute": 0}, {}, "keys.alice.requests_per_minute = 0 is", ">= 1"),
    ({"key": SECRET, "tokens_per_day": -5}, {}, "keys.alice.tokens_per_day = -5 is", ">= 1"),
    ({"key": SECRET, "max_queued": 0}, {}, "keys.alice.max_queued = 0 is", ">= 1"),
    ({}, {}, "keys.alice.key is missing", "set exactly one of key, key_env and key_file"),
    ({"weight": 2}, {}, "keys.alice.key is missing", "exactly one"),
    (
        {"key": SECRET, "key_env": "A"},
        {"A": "x"},
        'keys.alice.key_env = "A" is invalid',
        "keys.alice.key is set",
    ),
    ({"key_env": "A", "key_file": "/k"}, {"A": "x"}, 'keys.alice.key_file = "/k" is invalid', "exactly one"),
    ({"key_env": "ALICE_KEY"}, {}, 'keys.alice.key_env = "ALICE_KEY" is invalid', "ALICE_KEY is not set"),
    ({"key_env": "ALICE_KEY"}, {"ALICE_KEY": "  "}, "keys.alice.key_env", "not set or empty"),
    (
        {"key_file": "/nonexistent/alice.key"},
        {},
        'keys.alice.key_file = "/nonexistent/alice.key" is',
        "cannot be read",
    ),
    ({"key": SECRET, "kye": SECRET}, {}, "keys.alice.kye is not a known key", "allowed keys: key, key_env"),
    ({"key": ""}, {}, "keys.alice.key is invalid", "a non-empty string"),
    ({"key": 12345}, {}, "keys.alice.key is invalid", "a non-empty string"),
]


@pytest.mark.parametrize(("table", "env", "where", "words"), BAD_KEYS)
def test_bad_keys_name_the_key_and_never_the_secret(
    table: dict[str, Any], env: dict[str, str], where: str, words: str
) -> None:
    error = error_of(with_keys(alice=table), env=env)
    message = str(error)
    assert message.startswith(f"config error in {FILE}: {where}"), message
    assert words in message, message
    assert SECRET not in message and "12345" not in message and "\n" not in message
    assert error.key is not None and error.key.startswith("keys.alice")


def test_an_empty_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "alice.key").write_text("\n   \n")
    path = tmp_path / "router.toml"
    path.write_text('[keys.alice]\nkey_file = "alice.key"\n[models.a]\nmodel = "a.gguf"\n')
    with pytest.raises(ConfigError, match=r"keys\.alice\.key_file = .* is invalid: holds no key"):
        load_config(path, env={})


def test_two_keys_never_share_a_secret() -> None:
    message = str(error_of(with_keys(alice={"key": SECRET}, bob={"key_env": "BOB"}), env={"BOB": SECRET}))
    assert message == (
        f'config error in {FILE}: keys.bob.key_env = "BOB" is invalid: it holds the same secret as '
        "keys.alice; give every client a secret of its own"
    )


def test_a_named_key_is_no_plain_key() -> None:
    change = with_keys(alice={"key": SECRET})
    message = str(error_of(lambda data: (change(data), setter("router.api_keys", ["other", SECRET])(data))))
    assert "keys.alice.key is invalid: it holds the same secret as an entry of router.api_keys" in message
    message = str(error_of(change, env={"ROUTER_API_KEYS": f"x,{SECRET}"}))
    assert "an entry of ROUTER_API_KEYS" in message and SECRET not in message


def test_a_named_key_is_no_line_of_the_api_keys_file(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"# plain keys\nsk-plain\n{SECRET}\n")
    path = tmp_path / "router.toml"
    path.write_text(
        f'[router]\napi_keys_file = "keys"\n[keys.alice]\nkey = "{SECRET}"\n[models.a]\nmodel = "a.gguf"\n'
    )
    config = load_config(path, env={})
    with pytest.raises(ConfigError) as info:
        read_api_keys(config)
    assert "keys.alice.key is invalid: it holds the same secret as a line of router.api_keys_file" in str(
        info.value
    )
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("glob", ["qwen", "qwen-latest", "chat", "auto-chat", "q*", "sm?ll", "[cs]*"])
def test_globs_may_match_models_pools_and_aliases(glob: str) -> None:
    assert build(with_keys(alice={"key": SECRET, "models": [glob]})).keys["alice"].models == (glob,)


def test_globs_may_match_a_peers_models_and_anything_a_discovering_peer_may_have() -> None:
    listed = {"url": "http://10.0.0.2:8080", "models": ["big"]}
    config = build(
        lambda data: (
            data.update(peers={"p": listed}),
            with_keys(alice={"key": "a", "models": ["bi*"]})(data),
        )
    )
    assert config.keys["alice"].models == ("bi*",)
    error_of(
        lambda data: (data.update(peers={"p": listed}), with_keys(alice={"key": "a", "models": ["x*"]})(data))
    )
    discovering = {"url": "http://10.0.0.2:8080"}
    config = build(
        lambda data: (
            data.update(peers={"p": discovering}),
            with_keys(alice={"key": "a", "models": ["x*"]})(data),
        )
    )
    assert config.keys["alice"].models == ("x*",)


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("router.max_wait_interactive", 0, "0"),
        ("router.max_wait_standard", -1, "-1"),
        ("router.max_wait_batch", "long", '"long"'),
    ],
)
def test_max_waits_are_positive_numbers(key: str, value: Any, shown: str) -> None:
    message = str(error_of(setter(key, value)))
    assert message == f"config error in {FILE}: {key} = {shown} is invalid: must be a number > 0"


def test_a_bad_key_name_is_refused() -> None:
    message = str(error_of(with_keys(**{"al ice": {"key": SECRET}})))
    assert "a key name must be 1 to 200 printable characters without spaces" in message
    assert SECRET not in message
