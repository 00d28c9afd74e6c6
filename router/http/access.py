"""API keys: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``, compared in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence


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
