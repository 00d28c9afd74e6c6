"""Validation of ``[peers.NAME]``: another router, or any OpenAI-compatible server, whose models are served
here over HTTP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from router.config.schema import PEER_KEYS
from router.config.tables import Doc, check_name
from router.config.values import ModelConfig, PeerConfig


def parse_peer(doc: Doc, name: str, raw: Any, models: Mapping[str, ModelConfig]) -> PeerConfig:
    prefix = f"peers.{name}"
    check_name(doc, prefix, name, "a peer name")
    values = doc.keys(prefix, doc.table(prefix, raw), PEER_KEYS)
    values["url"] = _base_url(doc, f"{prefix}.url", values["url"])
    key_file = values.pop("api_key_file")
    if key_file is not None:
        if values["api_key"] is not None:
            raise doc.invalid(
                f"{prefix}.api_key_file", key_file, "set either api_key or api_key_file, not both"
            )
        path = doc.path_value(key_file) if isinstance(key_file, str) else key_file
        values["api_key"] = _read_key(doc, f"{prefix}.api_key_file", path)
        values["api_key_file"] = path
    for i, model in enumerate(values["models"]):
        check_name(doc, f"{prefix}.models[{i}]", model, "a model name")
        if model in models:
            raise doc.invalid(
                f"{prefix}.models",
                list(values["models"]),
                f"{model!r} is also models.{model} here; a name serves one model: drop it from the peer's "
                "list or rename the local model",
            )
    if len(set(values["models"])) != len(values["models"]):
        raise doc.invalid(f"{prefix}.models", list(values["models"]), "must not name a model twice")
    return PeerConfig(name=name, **values)


def _base_url(doc: Doc, key: str, url: str) -> str:
    """The peer's base URL without a trailing slash or ``/v1`` (requests add ``/v1/...`` themselves)."""
    rule = 'must be an http:// or https:// URL such as "http://192.168.1.20:8080", without query or user'
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise doc.invalid(key, url, rule) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise doc.invalid(key, url, rule)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise doc.invalid(key, url, rule + " (put a key in api_key)")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{path}"


def _read_key(doc: Doc, key: str, path: Any) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise doc.invalid(key, str(path), f"cannot be read: {exc.strerror or exc}") from None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise doc.invalid(key, str(path), "holds no key: write the key on its first non-empty line")


def remote_names(peers: Mapping[str, PeerConfig]) -> tuple[set[str], bool]:
    """The model names peers list, and whether any peer discovers its models (so any name may be one)."""
    listed = {model for peer in peers.values() for model in peer.models}
    return listed, any(not peer.models for peer in peers.values())
