"""``[rpc_devices.NAME]``, the models' ``rpc`` key and ``router.allow_public_rpc``."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.rpc_devices import endpoint_problem, split_endpoint
from tests.unit.config_builders import FILE, build, error_of


def with_rpc(endpoint: str = "127.0.0.1:50052", memory_mib: Any = 4096, **router: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"endpoint": endpoint}
        if memory_mib is not None:
            entry["memory_mib"] = memory_mib
        data["rpc_devices"] = {"box": entry}
        data["models"]["small"]["rpc"] = ["box"]
        data["router"].update(router)

    return change


def test_a_private_endpoint_is_accepted_and_kept_in_file_order() -> None:
    def change(data: dict[str, Any]) -> None:
        data["rpc_devices"] = {
            "b": {"endpoint": "192.168.1.20:50052", "memory_mib": 8192},
            "a": {"endpoint": "[fd00::5]:50053", "memory_mib": 1024},
            "c": {"endpoint": "localhost:50054", "memory_mib": 512},
        }
        data["models"]["small"]["rpc"] = ["a", "b"]
        data["models"]["small"]["gpus"] = []

    config = build(change)
    assert list(config.rpc_devices) == ["b", "a", "c"]
    a = config.rpc_devices["a"]
    assert (a.host, a.port, a.memory_mib, a.endpoint) == ("fd00::5", 50053, 1024, "[fd00::5]:50053")
    assert config.models["small"].rpc == ("a", "b")
    assert config.models["small"].gpus == ()
    assert config.models["qwen"].rpc == ()


@pytest.mark.parametrize("endpoint", ["8.8.8.8:50052", "[2001:4860::8888]:50052", "gpu-box.example:50052"])
def test_a_public_endpoint_is_refused_with_the_reason_and_the_fix(endpoint: str) -> None:
    error = error_of(with_rpc(endpoint))
    assert error.key == "rpc_devices.box.endpoint"
    head = f'config error in {FILE}: rpc_devices.box.endpoint = "{endpoint}" is invalid'
    assert str(error).startswith(head)
    assert "no authentication" in error.detail
    assert "SSH tunnel" in error.detail and "router.allow_public_rpc = true" in error.detail


@pytest.mark.parametrize("endpoint", ["8.8.8.8:50052", "gpu-box.example:50052"])
def test_allow_public_rpc_accepts_any_endpoint(endpoint: str) -> None:
    config = build(with_rpc(endpoint, allow_public_rpc=True))
    assert config.router.allow_public_rpc is True
    assert config.rpc_devices["box"].endpoint == endpoint


def test_allow_public_rpc_is_off_by_default() -> None:
    assert build().router.allow_public_rpc is False


@pytest.mark.parametrize(
    ("endpoint", "fragment"),
    [
        ("127.0.0.1", "must be"),
        ("127.0.0.1:0", "must be"),
        ("127.0.0.1:70000", "must be"),
        ("fd00::5:50052", "must be"),
        ("0.0.0.0:50052", "not the address of one machine"),
    ],
)
def test_a_malformed_endpoint_is_refused(endpoint: str, fragment: str) -> None:
    error = error_of(with_rpc(endpoint))
    assert error.key == "rpc_devices.box.endpoint" and fragment in error.detail


def test_memory_mib_is_required_because_it_cannot_be_read() -> None:
    error = error_of(with_rpc(memory_mib=None))
    assert error.key == "rpc_devices.box.memory_mib"
    assert "is missing" in error.detail and "cannot read a remote device's memory" in error.detail
    error = error_of(with_rpc(memory_mib=0))
    assert error.key == "rpc_devices.box.memory_mib" and "integer >= 1" in error.detail


def test_unknown_keys_and_a_repeated_endpoint_are_refused() -> None:
    def extra(data: dict[str, Any]) -> None:
        data["rpc_devices"] = {"box": {"endpoint": "10.0.0.2:50052", "memory_mib": 1, "memroy": 2}}

    error = error_of(extra)
    assert error.key == "rpc_devices.box.memroy" and "endpoint, memory_mib" in error.detail

    def twice(data: dict[str, Any]) -> None:
        data["rpc_devices"] = {
            "one": {"endpoint": "10.0.0.2:50052", "memory_mib": 1},
            "two": {"endpoint": "10.0.0.2:50052", "memory_mib": 1},
        }

    error = error_of(twice)
    assert error.key == "rpc_devices.two.endpoint" and "rpc_devices.one" in error.detail


def test_an_unknown_device_name_names_the_key_the_value_and_the_fix() -> None:
    def change(data: dict[str, Any]) -> None:
        with_rpc()(data)
        data["models"]["small"]["rpc"] = ["bxo"]

    error = error_of(change)
    assert error.key == "models.small.rpc"
    assert error.detail == (
        "models.small.rpc = [\"bxo\"] is invalid: 'bxo' is not an RPC device; declare it as "
        "[rpc_devices.bxo] with endpoint and memory_mib (RPC devices: box)"
    )


def test_a_model_with_rpc_devices_has_one_replica() -> None:
    def change(data: dict[str, Any]) -> None:
        with_rpc()(data)
        data["models"]["small"]["num_instance"] = 2

    error = error_of(change)
    assert error.key == "models.small.num_instance" and "one client at a time" in error.detail


def test_a_raw_rpc_flag_points_at_the_rpc_key() -> None:
    def raw(data: dict[str, Any]) -> None:
        data["models"]["small"]["--rpc"] = "127.0.0.1:50052"

    assert "write the router key without dashes: rpc" in error_of(raw).detail

    def default(data: dict[str, Any]) -> None:
        data["defaults"] = {"rpc": "127.0.0.1:50052"}

    assert "per-model key" in error_of(default).detail


def test_endpoint_helpers() -> None:
    assert split_endpoint("10.1.2.3:5") == ("10.1.2.3", 5)
    assert split_endpoint("[::1]:50052") == ("::1", 50052)
    assert split_endpoint("::1:50052") is None
    assert endpoint_problem("169.254.3.4", allow_public=False) is None  # link-local
    assert endpoint_problem("::1", allow_public=False) is None
    assert endpoint_problem("LOCALHOST", allow_public=False) is None
    assert endpoint_problem("100.100.1.1", allow_public=False) is not None  # carrier-grade NAT: not private
