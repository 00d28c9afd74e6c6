"""A request's priority class: its client's, lowered when the request asks, never raised.

A request may ask for a class with the header ``x-router-class`` (``interactive``, ``standard`` or
``batch``) or with the body's ``service_tier`` (OpenAI's: ``flex`` is ``batch``, ``priority`` is
``interactive``, ``auto`` and ``default`` leave the class as it is; Anthropic's ``standard_only`` and
OpenAI's ``scale`` leave it too). What it asks for above its client's class is clamped to the client's
class, silently; an unknown value is refused (400 ``invalid_class``). The body is forwarded as it came,
``service_tier`` included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.http.access import Client
from router.http.browser_guard import Refusal
from router.http.errors import HttpCode
from statemachine import RequestClass

CLASS_HEADER = "x-router-class"
# service_tier → the class it asks for (None: the client's own).
SERVICE_TIERS: Mapping[str, RequestClass | None] = {
    "auto": None,
    "default": None,
    "flex": RequestClass.BATCH,
    "priority": RequestClass.INTERACTIVE,
    "scale": None,
    "standard_only": None,
}


def request_class(
    client: Client, headers: Mapping[str, str], body: Mapping[str, Any] | None
) -> RequestClass | Refusal:
    """The class a request is served in: the lowest of its client's class and what the header and the
    body ask for (lower is served later); a refusal for a value that names no class."""
    klass = client.klass
    header = headers.get(CLASS_HEADER)
    if header is not None:
        asked = RequestClass.named(header.strip().lower())
        if asked is None:
            names = ", ".join(c.label for c in RequestClass)
            message = f"{CLASS_HEADER}: {_shown(header)} is not a class; send one of {names}"
            return Refusal(HttpCode.INVALID_CLASS, message)
        klass = max(klass, asked)
    tier = None if body is None else body.get("service_tier")
    if tier is not None:
        if not isinstance(tier, str) or tier not in SERVICE_TIERS:
            names = ", ".join(SERVICE_TIERS)
            message = f"service_tier = {_shown(tier)} is not a service tier here; send one of {names}"
            return Refusal(HttpCode.INVALID_CLASS, message)
        asked_tier = SERVICE_TIERS[tier]
        if asked_tier is not None:
            klass = max(klass, asked_tier)
    return klass


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
