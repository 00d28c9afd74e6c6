"""Configuration validation: every rule and the message that names the file, the key, the value and the
rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

from router.config.keyspec import render_value
from router.config.load import ConfigError, config_from_dict
from router.config.schema import ROUTER_KEYS
from tests.unit.config_builders import FILE, build, deleter, error_of, setter


def test_the_documented_message_exactly() -> None:
    err = error_of(setter("models.qwen.parallel", 0))
    assert str(err) == (
        "config error in /etc/llama-router.toml: models.qwen.parallel = 0 is invalid: must be an integer >= 1"
    )
    assert err.path == FILE
    assert err.key == "models.qwen.parallel"


# (key to set, value, the value as the message shows it (None: a secret it never shows), words of the rule)
BAD_VALUES = [
    ("router.host", "", '""', "non-empty string"),
    ("router.port", 70000, "70000", "an integer between 0 and 65535"),
    ("router.port", "80", '"80"', "an integer between 0 and 65535"),
    ("router.port", True, "true", "an integer between 0 and 65535"),
    ("router.llama_server", "", '""', "non-empty path"),
    ("router.max_models_per_gpu", 0, "0", "an integer >= 1"),
    ("router.eviction", "random", '"random"', 'one of "lru", "fifo"'),
    ("router.queue_head_grace", -1, "-1", "a number >= 0"),
    ("router.queue_force_load_timeout", 0, "0", "a number > 0"),
    ("router.queue_limit", -1, "-1", "an integer >= 0"),
    ("router.routing_queue_limit", 1.5, "1.5", "an integer >= 0"),
    ("router.affinity_guard", -1, "-1", "an integer >= 0"),
    ("router.prefix_affinity", "yes", '"yes"', "true or false"),
    ("router.num_gpus", -1, "-1", "an integer >= 0"),
    ("router.load_timeout", 0, "0", "a number > 0"),
    ("router.stop_timeout", -1.0, "-1.0", "a number > 0"),
    ("router.shutdown_grace", -0.5, "-0.5", "a number >= 0"),
    ("router.shutdown_grace", "soon", '"soon"', "a number >= 0"),
    ("router.max_body_mib", 0, "0", "an integer >= 1"),
    ("router.api_keys", "sk-1", None, "a list of non-empty strings"),
    ("router.api_keys", ["sk-1", ""], None, "a list of non-empty strings"),
    ("router.api_keys_file", 7, "7", "non-empty path"),
    ("router.history_db", False, "false", "non-empty path"),
    ("router.history_max_rows", 0, "0", "an integer >= 1"),
    ("router.history_max_age_days", 0, "0", "a number > 0"),
    ("router.gpu_reserve_mib", -1, "-1", "an integer >= 0"),
    ("router.ctx_floor", 0, "0", "an integer >= 1"),
    ("router.log_lines", 0, "0", "an integer >= 1"),
    ("router.replica_logs", "", '""', "non-empty path"),
    ("router.replica_log_files", 0, "0", "an integer >= 1"),
    ("router.replica_log_max_mib", 0.5, "0.5", "an integer >= 1"),
    ("router.default_pool", "nope", '"nope"', "must name a pool or pool alias; pools: chat"),
    ("router", "x", '"x"', "must be a table"),
    ("devices.0.memory_mib", 0, "0", "an integer >= 1"),
    ("devices.0", 5, "5", "must be a table"),
    ("models.qwen.model", 5, "5", "non-empty path"),
    ("models.qwen.num_instance", 0, "0", "an integer >= 1"),
    ("models.qwen.parallel", 2.0, "2.0", "an integer >= 1"),
    ("models.qwen.ctx", 0, "0", "an integer >= 1"),
    ("models.qwen.ctx", 2, "2", "must be >= parallel (4)"),
    ("models.qwen.gpu_layers", -1, "-1", "an integer >= 0"),
    ("models.qwen.aliases", "q", '"q"', "a list of non-empty strings"),
    ("models.qwen.pinned", "yes", '"yes"', "true or false"),
    ("models.qwen.ttl", 0, "0", "a number > 0"),
    ("models.qwen.load_on_startup", 1, "1", "true or false"),
    ("models.qwen.gpus", [0, 0], "[0, 0]", "distinct GPU ids"),
    ("models.qwen.gpus", [-2], "[-2]", "integers >= 0"),
    ("models.qwen.gpus", "some", '"some"', '"all", "any", -1, a GPU id'),
    ("models.qwen.gpus", [0, 2], "[0, 2]", "< router.num_gpus = 2"),
    ("models.qwen.gpus", 2, "2", "< router.num_gpus = 2"),
    ("models.qwen.gpus", True, "true", '"all", "any", -1, a GPU id'),
    ("models.qwen.gpus", [1.0], "[1.0]", "GPU ids (integers >= 0"),
    ("models.qwen.pricing", "cheap", '"cheap"', "must be a table"),
    ("models.qwen.pricing", {}, "{}", "at least one of input, cached_input, output"),
    ("models.qwen.pricing.input", -1, "-1", "a number >= 0"),
    ("models.qwen.pricing.output", "2", '"2"', "a number >= 0"),
    ("models.qwen.reasoning_effort.options", [], "[]", "non-empty list of distinct non-empty strings"),
    ("models.qwen.reasoning_effort.options", ["a", "a"], '["a", "a"]', "distinct"),
    ("models.qwen.cache-type-k", "q9", '"q9"', '"f16", "bf16", "q8_0"'),
    ("models.qwen.ctv", 8, "8", '"q4_0"'),
    ("models.qwen.override-kv", {"a": 1}, '{"a": 1}', "a string, a number, true/false, or a list"),
    ("models.qwen.override-kv", [True], "[true]", "a list of strings and numbers"),
    ("defaults.flash-attn", {"on": True}, '{"on": true}', "a string, a number, true/false, or a list"),
    ("defaults.cache-type-v", "q3", '"q3"', '"iq4_nl"'),
    ("pools.chat.members", [], "[]", "must list at least one model; models: qwen, small"),
    (
        "pools.chat.members",
        ["qwen", "nope"],
        '["qwen", "nope"]',
        "'nope' is not a model; models: qwen, small",
    ),
    ("pools.chat.members", ["qwen", "qwen"], '["qwen", "qwen"]', "must not name a model twice"),
    ("pools.chat.members", ["qwen-latest"], '["qwen-latest"]', "'qwen-latest' is an alias of models.qwen"),
    ("pools.chat.members", "qwen", '"qwen"', "a list of non-empty strings"),
    ("pools.chat.fallback", "yes", '"yes"', "true or false"),
]


@pytest.mark.parametrize(("key", "value", "shown", "allowed"), BAD_VALUES)
def test_bad_values_name_file_key_value_and_rule(
    key: str, value: Any, shown: str | None, allowed: str
) -> None:
    change = setter(key, value)
    if key.startswith("models.qwen.reasoning_effort"):
        change = setter("models.qwen.reasoning_effort", {"options": value})
    message = str(error_of(change))
    if shown is None:
        assert message.startswith(f"config error in {FILE}: {key} is invalid: "), message
        assert "sk-1" not in message
    else:
        assert message.startswith(f"config error in {FILE}: {key} = {shown} is invalid: "), message
    assert allowed in message


@pytest.mark.parametrize(
    ("table", "key", "allowed_sample"),
    [
        ("router", "prot", "port"),
        ("router", "pinned", "history_db"),
        ("pools.chat", "member", "members"),
        ("devices.0", "memory", "memory_mib"),
        ("models.qwen.pricing", "input_cached", "cached_input"),
        ("models.qwen.reasoning_effort", "levels", "options"),
    ],
)
def test_unknown_keys_are_refused_with_the_allowed_list(table: str, key: str, allowed_sample: str) -> None:
    def change(data: dict[str, Any]) -> None:
        if table == "models.qwen.reasoning_effort":
            setter(table, {"options": ["low"], key: 1})(data)
        else:
            setter(f"{table}.{key}", 1)(data)

    message = str(error_of(change))
    assert f"{FILE}: {table}.{key} = 1 is not a known key; allowed keys: " in message
    assert allowed_sample in message.split("allowed keys: ")[1]


def test_unknown_router_key_lists_every_allowed_key() -> None:
    message = str(error_of(setter("router.prot", 1)))
    allowed = message.split("allowed keys: ")[1].split(", ")
    assert allowed == [spec.name for spec in ROUTER_KEYS]


def test_unknown_top_level_table() -> None:
    message = str(error_of(setter("modles", {"qwen": {"model": "/models/q.gguf"}})))
    assert message == (
        f"config error in {FILE}: modles is not a known key; allowed keys: router, devices, defaults, "
        "models, pools, peers, rpc_devices, keys"
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("kyes", {"alice": {"key": "sk-hidden-1"}}),  # a table's contents are never shown
        ("router.api_key", "sk-hidden-1"),  # a key named like a secret
        ("router.keys", ["sk-hidden-1"]),
        ("peers.p.api_key", 5),
        ("keys", "sk-hidden-1"),
        ("keys.alice", "sk-hidden-1"),
        ("keys.alice.secret", "sk-hidden-1"),
    ],
)
def test_unknown_or_invalid_secrets_are_never_shown(key: str, value: Any) -> None:
    def change(data: dict[str, Any]) -> None:
        setter(key, value)(data)
        if key.startswith("peers.p"):
            data["peers"]["p"]["url"] = "http://10.0.0.2:8080"

    error = error_of(change)
    assert "sk-hidden-1" not in str(error) and " = 5" not in str(error), error
    assert str(error).startswith(f"config error in {FILE}: {key} is "), error
    assert "\n" not in str(error)


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("host", "loopback"),
        ("port", "its own port"),
        ("--host", "loopback"),
        ("m", "`model` key"),
        ("-m", "`model` key"),
        ("--model", "`model` key"),
        ("c", "`ctx` key"),
        ("-c", "`ctx` key"),
        ("ctx-size", "`ctx` key"),
        ("np", "`parallel` key"),
        ("--parallel", "`parallel` key"),
        ("ngl", "`gpu_layers` key"),
        ("-ngl", "`gpu_layers` key"),
        ("n-gpu-layers", "`gpu_layers` key"),
        ("gpu-layers", "`gpu_layers` key"),
        ("fit", "--fit off"),
        ("--fit", "--fit off"),
        ("api-key", "router.api_keys"),
        ("models-dir", "manages models itself"),
        ("cache-ram", "`cram` key"),
        ("--cache-ram", "`cram` key"),
    ],
)
@pytest.mark.parametrize("table", ["models.qwen", "defaults"])
def test_flags_the_router_sets_are_refused_with_a_hint(table: str, key: str, hint: str) -> None:
    message = str(error_of(setter(f"{table}.{key}", 4096)))
    shown = f"{table}.{key}" if key == "api-key" else f"{table}.{key} = 4096"  # a secret is never shown
    assert f"{FILE}: {shown} is invalid: the router sets this llama-server flag itself; " in message
    assert hint in message


@pytest.mark.parametrize("key", ["model", "parallel", "ctx", "gpu_layers", "ttl", "pinned", "aliases"])
def test_per_model_keys_are_refused_in_defaults(key: str) -> None:
    message = str(error_of(setter(f"defaults.{key}", 4)))
    assert (
        f"{FILE}: defaults.{key} = 4 is invalid: {key} is a per-model key; set it in [models.NAME]" in message
    )


@pytest.mark.parametrize("key", ["--ctx", "-gpus", "--ttl"])
def test_router_keys_written_with_dashes_in_a_model(key: str) -> None:
    message = str(error_of(setter(f"models.qwen.{key}", 4)))
    assert (
        f"models.qwen.{key} = 4 is invalid: write the router key without dashes: {key.lstrip('-')}" in message
    )


@pytest.mark.parametrize(
    ("table", "key"), [("models.qwen", "-cram"), ("defaults", "--cram"), ("defaults", "-cram")]
)
def test_cram_written_with_dashes_is_refused(table: str, key: str) -> None:
    message = str(error_of(setter(f"{table}.{key}", 1024)))
    assert f"{FILE}: {table}.{key} = 1024 is invalid: write the router key without dashes: cram" in message


@pytest.mark.parametrize("table", ["models.qwen", "defaults"])
@pytest.mark.parametrize("value", [-1, 1.5, "1024", True])
def test_cram_must_be_a_whole_number_of_mib(table: str, value: Any) -> None:
    err = error_of(setter(f"{table}.cram", value))
    assert err.key == f"{table}.cram"
    assert "is invalid: must be an integer >= 0" in str(err)


def test_cram_in_defaults_applies_to_models_that_do_not_set_it() -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {"cram": 1024, "t": 4}
        data["models"]["other"] = {"model": "/m/other.gguf", "cram": 0}

    config = build(change)
    assert config.models["qwen"].cram == 1024
    assert config.models["other"].cram == 0  # the model's own value wins, 0 included
    assert dict(config.defaults) == {"t": 4}  # not a llama-server flag
    assert build(lambda data: None).models["qwen"].cram is None  # unset: sized by placement


def test_kv_store_in_defaults_applies_to_models_that_do_not_set_it() -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {"kv_store": False, "t": 4}
        data["models"]["other"] = {"model": "/m/other.gguf", "kv_store": True}

    config = build(change)
    assert config.models["qwen"].kv_store is False
    assert config.models["small"].kv_store is False
    assert config.models["other"].kv_store is True  # the model's own value wins
    assert config.router.kv_store is True  # the router's switch is another key
    assert dict(config.defaults) == {"t": 4}  # not a llama-server flag
    assert all(model.kv_store for model in build(lambda data: None).models.values())  # unset: on


def test_kv_store_false_on_a_model_wins_over_defaults_true() -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {"kv_store": True}
        data["models"]["small"]["kv_store"] = False

    config = build(change)
    assert config.models["qwen"].kv_store is True
    assert config.models["small"].kv_store is False


@pytest.mark.parametrize("value", [0, "false", [False]])
def test_kv_store_in_defaults_must_be_a_boolean(value: Any) -> None:
    err = error_of(setter("defaults.kv_store", value))
    assert err.key == "defaults.kv_store"
    assert f"defaults.kv_store = {render_value(value)} is invalid: must be true or false" in str(err)


@pytest.mark.parametrize("key", ["--kv_store", "-kv_store"])
def test_kv_store_written_with_dashes_in_defaults_is_refused(key: str) -> None:
    message = str(error_of(setter(f"defaults.{key}", False)))
    assert f"defaults.{key} = false is invalid: write the router key without dashes: kv_store" in message


@pytest.mark.parametrize("key", ["---x", "a b", "x=1", "-"])
def test_malformed_flag_names(key: str) -> None:
    message = str(error_of(setter(f"models.qwen.{key}", "1")))
    assert f"models.qwen.{key} = " in message
    assert "flag name must be non-empty, without spaces or '='" in message


def test_false_cache_type_drops_the_default() -> None:
    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {"ctk": "q8_0"}
        data["models"]["qwen"]["cache-type-k"] = False

    config = build(change)
    assert config.models["qwen"].extra_args == (("cache-type-k", False),)
    message = str(error_of(setter("models.qwen.ctk", True)))
    assert "models.qwen.ctk = true is invalid: must be one of " in message


def test_two_spellings_of_one_flag_in_one_table() -> None:
    def change(data: dict[str, Any]) -> None:
        data["models"]["qwen"]["cache-type-k"] = "q8_0"
        data["models"]["qwen"]["ctk"] = "q4_0"

    message = str(error_of(change))
    assert (
        'models.qwen.ctk = "q4_0" is invalid: the same llama-server flag as models.qwen.cache-type-k'
        in message
    )


def test_missing_required_keys() -> None:
    message = str(error_of(deleter("models.qwen.model")))
    assert message == (
        f"config error in {FILE}: models.qwen.model is missing: it is required and must be a non-empty "
        "path string"
    )
    message = str(error_of(deleter("pools.chat.members")))
    assert (
        f"{FILE}: pools.chat.members is missing: it is required and must be a list of non-empty strings"
        in message
    )


def test_at_least_one_model() -> None:
    message = str(error_of(setter("models", {})))
    assert (
        message == f"config error in {FILE}: models is missing: at least one [models.NAME] table is required"
    )


def test_document_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match="must be a table"):
        config_from_dict([1, 2], FILE)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("devices", "rule"),
    [
        ({"x": {}}, "an integer >= 0 and < router.num_gpus (2)"),
        ({"2": {}}, "an integer >= 0 and < router.num_gpus (2)"),
    ],
)
def test_device_ids(devices: dict[str, Any], rule: str) -> None:
    message = str(error_of(setter("devices", devices)))
    name = next(iter(devices))
    assert (
        message
        == f"config error in {FILE}: devices.{name} is invalid: the table name must be a GPU id: {rule}"
    )


def test_device_ids_without_num_gpus() -> None:
    def change(data: dict[str, Any]) -> None:
        data["router"] = {}
        data["devices"] = {"7": {"memory_mib": 100}, "01": {}}

    message = str(error_of(change))
    assert (
        message
        == f"config error in {FILE}: devices.01 is invalid: the table name must be a GPU id: an integer >= 0"
    )


def test_devices_are_keyed_by_int_and_sorted() -> None:
    config = build(setter("devices", {"1": {"memory_mib": 4096}, "0": {}}))
    assert list(config.devices.items()) == [(0, attrs.evolve(config.devices[0])), (1, config.devices[1])]
    assert config.devices[0].memory_mib is None
    assert config.devices[1].memory_mib == 4096


def test_pinned_model_cannot_have_a_ttl() -> None:
    def change(data: dict[str, Any]) -> None:
        data["models"]["qwen"].update(pinned=True, ttl=60)

    message = str(error_of(change))
    assert "models.qwen.ttl = 60.0 is invalid: a pinned model is never unloaded" in message


def test_reasoning_effort_default_must_be_an_option() -> None:
    message = str(
        error_of(setter("models.qwen.reasoning_effort", {"options": ["low", "high"], "default": "max"}))
    )
    assert (
        f'{FILE}: models.qwen.reasoning_effort.default = "max" is invalid: must be one of the options: '
        in message
    )
    assert '"low", "high"' in message


def test_fallback_pools() -> None:
    message = str(error_of(setter("pools.chat", {"members": ["qwen"], "fallback": True})))
    assert (
        f"{FILE}: pools.chat.fallback = true is invalid: fallback = true needs at least two members"
        in message
    )

    def with_ttl(data: dict[str, Any]) -> None:
        data["models"]["small"]["ttl"] = 30
        data["pools"]["chat"]["fallback"] = True

    message = str(error_of(with_ttl))
    assert "pools.chat.fallback = true is invalid: fallback members stay loaded" in message
    assert "models.small.ttl = 30.0" in message

    config = build(setter("pools.chat.fallback", True))
    assert config.pools["chat"].fallback is True


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            setter("pools.qwen", {"members": ["small"]}),
            "pools.qwen is invalid: the name 'qwen' is already used by ",
        ),
        (
            setter("models.small.aliases", ["qwen"]),
            "models.small.aliases = [\"qwen\"] is invalid: the alias 'qwen'",
        ),
        (
            setter("models.small.aliases", ["qwen-latest"]),
            "the alias 'qwen-latest' is already used by models.qwen",
        ),
        (
            setter("pools.chat.aliases", ["small"]),
            "pools.chat.aliases = [\"small\"] is invalid: the alias 'small'",
        ),
        (setter("models.small.aliases", ["chat"]), "the alias 'chat' is already used by pools.chat"),
        (setter("models.small.aliases", ["s", "s"]), "the alias 's' is already used by models.small.aliases"),
        (setter("models.small.aliases", ["small"]), "the alias 'small' is already used by models.small"),
        (
            setter("models.small.aliases", ["auto-chat"]),
            "'auto-chat' is already used by models.small.aliases",
        ),
    ],
)
def test_names_are_unique_across_models_pools_and_aliases(change: Callable[..., None], fragment: str) -> None:
    message = str(error_of(change))
    assert message.startswith(f"config error in {FILE}: ")
    assert fragment in message
    assert "must be unique" in message


def test_names_and_aliases_must_be_printable_without_spaces() -> None:
    message = str(error_of(setter("models.my model", {"model": "x.gguf"})))
    assert f'{FILE}: models.my model = "my model" is invalid: a model name must be' in message
    message = str(error_of(setter("pools.chat.aliases", ["ok", "a\tb"])))
    assert message == (
        f'config error in {FILE}: pools.chat.aliases[1] = "a\\tb" is invalid: an alias must be 1 to 200 '
        "printable characters without spaces"
    )


def test_preload_names_models_only() -> None:
    err = error_of(setter("router.preload", ["qwen", "nope"]))
    assert err.key == "router.preload"
    assert 'router.preload = "nope" is invalid: must name a model or model alias here; models:' in str(err)


def test_queue_head_grace_and_swap_batching_are_exclusive() -> None:
    def both(data: dict[str, Any]) -> None:
        data["router"]["queue_head_grace"] = 0
        data["router"]["swap_hold"] = 1

    err = error_of(both)
    assert err.key == "router.queue_head_grace"
    assert "router.queue_head_grace = 0 and router.swap_hold are both set" in str(err)
    assert "Remove queue_head_grace to batch swaps, or remove swap_hold" in str(err)
    assert build(setter("router.queue_head_grace", 0)).router.queue_head_grace == 0


def test_gpus_any_and_its_keys_in_defaults_and_models() -> None:
    """[defaults] gpus = "any" places every model that names no GPUs; a model's own gpus wins."""

    def change(data: dict[str, Any]) -> None:
        data["defaults"] = {"gpus": "any", "gpus_max": 1, "spread": False}
        data["models"]["small"]["gpus"] = [1]

    config = build(change)
    qwen, small = config.models["qwen"], config.models["small"]
    assert (qwen.gpus, qwen.gpus_max, qwen.spread) == ("any", 1, False)
    assert (small.gpus, small.gpus_max) == ((1,), None)


def test_gpus_max_needs_gpus_any_and_any_takes_no_rpc() -> None:
    message = str(error_of(setter("models.small.gpus_max", 2)))
    assert (
        'models.small.gpus_max = 2 is invalid: only a model the scheduler places has it: set gpus = "any"'
        in (message)
    )

    def rpc(data: dict[str, Any]) -> None:
        data["rpc_devices"] = {"box": {"endpoint": "127.0.0.1:50052", "memory_mib": 4096}}
        data["models"]["small"].update(gpus="any", rpc=["box"])

    assert 'models.small.gpus = "any" is invalid: a model with rpc devices runs on the GPUs it names' in str(
        error_of(rpc)
    )
