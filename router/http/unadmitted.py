"""The history record of an API call refused before the scheduler saw it (a bad body, an unknown model, a
missing key, a key over its limit): it shows in /history and /metrics like any other request."""

from __future__ import annotations

import json
import time

from router.journal.records import RequestRecord


def unadmitted_record(
    *,
    at: float,
    arrived_mono: float,
    client: str,
    endpoint: str,
    asked: str | None,
    status: int,
    body: bytes,
    key: str = "",
) -> RequestRecord:
    """The record of a refusal answered with ``status`` and the OpenAI-shaped error ``body``."""
    message: str | None = None
    try:
        message = str(json.loads(body)["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        message = None
    return RequestRecord(
        at=at,
        client=client,
        endpoint=endpoint,
        model_asked=asked,
        model_served=None,
        status=status,
        duration=max(0.0, time.monotonic() - arrived_mono),
        error=message,
        key=key,
    )
