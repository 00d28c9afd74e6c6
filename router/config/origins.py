"""Host names and origins as the operator writes them (``allowed_hosts``, ``cors_origins``) and as browsers
send them: parsing, checking, and the canonical form both sides are compared in."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

DEFAULT_PORTS: Mapping[str, int] = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header as (lower-case host without brackets or trailing dot, port); None when malformed."""
    text = value.strip().lower()
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:
        return None
    else:
        host, port_text = text, ""
    host = host.removesuffix(".")
    if not host or (port_text and (not port_text.isdigit() or int(port_text) > 65535)):
        return None
    return host, int(port_text) if port_text else None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_loopback_host(host: str) -> bool:
    """localhost, ``*.localhost``, 127.0.0.0/8 or ::1 (``host`` as :func:`split_host` returns it)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def host_entry_problem(entry: str) -> str | None:
    """Why ``entry`` cannot be an ``allowed_hosts`` item, or None."""
    if entry == "*":
        return None
    parsed = split_host(entry.removeprefix("."))
    if parsed is None or parsed[1] is not None or "/" in entry or "*" in entry:
        return f"{entry!r} is not one (a host name has no scheme, port or path)"
    return None


def canonical_host_entry(entry: str) -> str:
    return entry.strip().lower().removesuffix(".")


def canonical_origin(text: str) -> str | None:
    """``scheme://host[:port]`` in the form browsers send (lower case, no default port), or None."""
    text = text.strip()
    if text.lower() == "null":
        return "null"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if (
        not parts.scheme
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        return None
    scheme = parts.scheme.lower()
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port is not None and port != DEFAULT_PORTS.get(scheme):
        host += f":{port}"
    return f"{scheme}://{host}"


def origin_entry_problem(entry: str) -> str | None:
    """Why ``entry`` cannot be a ``cors_origins`` item, or None."""
    if entry == "*" or canonical_origin(entry) is not None:
        return None
    return f"{entry!r} is not one (an origin is scheme://host[:port], without a path)"


def canonical_origin_entry(entry: str) -> str:
    return "*" if entry.strip() == "*" else canonical_origin(entry) or entry
