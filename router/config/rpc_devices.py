"""``[rpc_devices.NAME]`` and the models' ``rpc`` key: remote devices reached through llama.cpp's rpc-server.

llama.cpp's RPC protocol has no authentication and no encryption: whoever can open a TCP connection to an
rpc-server can allocate memory on its device, run tensors there and read what it holds. So an endpoint must
name ``localhost`` or an IP address in a loopback, private (RFC 1918, IPv6 unique local) or link-local range;
anything else, host names included (a name can resolve anywhere, and again differently later), is refused
unless ``router.allow_public_rpc`` is true.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from router.config.schema import RPC_DEVICE_KEYS
from router.config.tables import Doc, valid_name
from router.config.values import FrozenMap, ModelConfig, RpcDeviceConfig

__all__ = ["check_model_rpc", "endpoint_problem", "parse_rpc_devices", "split_endpoint"]

NO_AUTH = (
    "llama.cpp's RPC has no authentication, so anyone who reaches the endpoint can run tensors on the "
    "device and read its memory"
)


def split_endpoint(text: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` for IPv6) as (host without brackets, port), or None when malformed."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            return None
    if not host or any(c.isspace() for c in host):
        return None
    if not port_text.isascii() or not port_text.isdigit():
        return None
    port = int(port_text)
    if not 1 <= port <= 65535:
        return None
    return host, port


def endpoint_problem(host: str, *, allow_public: bool) -> str | None:
    """Why ``host`` may not be an RPC endpoint, or None when it may."""
    if host.lower() == "localhost":
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if allow_public:
            return None
        return (
            f"{host!r} is a host name, and a name can resolve to any address; write the IP address of the "
            "machine on your private network (or localhost)"
        )
    if address.is_unspecified or address.is_multicast:
        return f"{host} is not the address of one machine"
    if address.is_loopback or address.is_private or address.is_link_local or allow_public:
        return None
    return f"{host} is outside the loopback, private and link-local ranges"


def parse_rpc_devices(
    doc: Doc, table: Mapping[str, Any], *, allow_public: bool
) -> FrozenMap[str, RpcDeviceConfig]:
    """``[rpc_devices]``: one table per device, in file order."""
    allowed = [spec.name for spec in RPC_DEVICE_KEYS]
    endpoint_spec, memory_spec = RPC_DEVICE_KEYS
    devices: dict[str, RpcDeviceConfig] = {}
    seen: dict[tuple[str, int], str] = {}
    for name, raw in table.items():
        prefix = f"rpc_devices.{name}"
        if not valid_name(name):
            raise doc.invalid(
                prefix, name, "an RPC device name must be 1 to 200 printable characters without spaces"
            )
        entry = doc.table(prefix, raw)
        for key, value in entry.items():
            if key not in allowed:
                raise doc.unknown(f"{prefix}.{key}", value, allowed)
        for spec in RPC_DEVICE_KEYS:
            if entry.get(spec.name) is None:
                why = spec.allowed()
                if spec.name == "memory_mib":
                    why += " (the router cannot read a remote device's memory: declare it)"
                raise doc.missing(f"{prefix}.{spec.name}", why)
        endpoint = doc.check(prefix, endpoint_spec, entry["endpoint"])
        memory = doc.check(prefix, memory_spec, entry["memory_mib"])
        parts = split_endpoint(endpoint)
        if parts is None:
            raise doc.invalid(f"{prefix}.endpoint", endpoint, "must be " + endpoint_spec.allowed())
        host, port = parts
        problem = endpoint_problem(host, allow_public=allow_public)
        if problem is not None:
            raise doc.invalid(
                f"{prefix}.endpoint",
                endpoint,
                f"{problem}. {NO_AUTH}; reach the rpc-server over a trusted private network or an SSH "
                "tunnel to localhost, or set router.allow_public_rpc = true if the path is protected "
                "otherwise",
            )
        where = (host.lower(), port)
        if where in seen:
            raise doc.invalid(
                f"{prefix}.endpoint",
                endpoint,
                f"rpc_devices.{seen[where]} has the same endpoint; an rpc-server serves one client at a "
                "time, declare it once",
            )
        seen[where] = name
        devices[name] = RpcDeviceConfig(name=name, endpoint=endpoint, host=host, port=port, memory_mib=memory)
    return FrozenMap(devices)


def check_model_rpc(doc: Doc, model: ModelConfig, devices: Mapping[str, RpcDeviceConfig]) -> None:
    """A model's ``rpc`` names declared devices, each once, and asks for one replica only."""
    key = f"models.{model.name}.rpc"
    known = ", ".join(devices) or "none declared"
    for name in model.rpc:
        if name not in devices:
            raise doc.invalid(
                key,
                list(model.rpc),
                f"{name!r} is not an RPC device; declare it as [rpc_devices.{name}] with endpoint and "
                f"memory_mib (RPC devices: {known})",
            )
    if len(set(model.rpc)) != len(model.rpc):
        raise doc.invalid(key, list(model.rpc), "must not name an RPC device twice")
    if model.rpc and model.num_instance > 1:
        raise doc.invalid(
            f"models.{model.name}.num_instance",
            model.num_instance,
            "a model with rpc devices has one replica: an rpc-server serves one client at a time; set "
            "num_instance = 1",
        )
