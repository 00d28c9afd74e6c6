"""API keys: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``, compared in constant time, and the client a
key names.

A plain key (``router.api_keys``, ``ROUTER_API_KEYS``, ``router.api_keys_file``) is an anonymous
``standard`` client with every right, as is everyone when no key is configured at all. A named key
(``[keys.NAME]``) is the client of that name, with its class, its scope and its rights.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

import attrs

from router.config.values import KeyConfig
from statemachine import RequestClass


@attrs.frozen
class Client:
    """Who sent a request: its key's ``name`` ("" for a plain key or none), its ``klass`` (the highest class
    its requests may have), its ``scope`` (globs over model, pool and alias names; None: everything) and
    whether it may use the admin actions."""

    name: str = ""
    klass: RequestClass = RequestClass.STANDARD
    scope: tuple[str, ...] | None = None
    admin: bool = True


# A plain key's client, and everyone's where no key is configured.
ANONYMOUS = Client()
# Who reaches an open path (/health, the pages) without a valid key where keys are configured: no model,
# no admin action.
VISITOR = Client(scope=(), admin=False)


def client_of(key: KeyConfig) -> Client:
    klass = RequestClass.named(key.klass)
    assert klass is not None, key.klass  # the loader accepts only the classes' labels
    return Client(name=key.name, klass=klass, scope=key.models, admin=key.admin)


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    key = headers.get("x-api-key")
    return key.strip() if key else None


def key_accepted(keys: Sequence[bytes], presented: str | None) -> bool:
    """True when ``presented`` equals one of ``keys``; every key is compared, so timing tells nothing."""
    if presented is None:
        return False
    candidate = presented.encode()
    found = False
    for key in keys:
        found |= hmac.compare_digest(key, candidate)
    return found


def identify(plain: Sequence[bytes], named: Mapping[str, KeyConfig], presented: str | None) -> Client | None:
    """The client whose key ``presented`` is, or None. Every key, plain and named, is compared in constant
    time, so timing tells neither whether nor which one matched."""
    if presented is None:
        return None
    candidate = presented.encode()
    plain_match = key_accepted(plain, presented)
    found: KeyConfig | None = None
    for key in named.values():
        if hmac.compare_digest(key.secret.encode(), candidate):
            found = key
    if found is not None:
        return client_of(found)
    return ANONYMOUS if plain_match else None
