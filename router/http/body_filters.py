"""A model's request filters: the body fields its ``set_params`` forces and its ``strip_params`` removes.

Applied by the proxy to every request relayed to a local replica, once the model that serves it is known
(for a pool, the member chosen). A model without filters gets the client's bytes unchanged; so does a body
that is not a JSON object (a multipart upload, an empty GET). A filtered body is serialised again, as a
pooled request's body already is when its ``model`` is rewritten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from router.config.model_extras import thawed_json
from router.config.values import ModelConfig
from router.http.request_body import json_object

__all__ = ["filter_body", "filtered_for"]


def filter_body(body: bytes, set_params: Mapping[str, Any], strip_params: Sequence[str]) -> bytes:
    """``body`` with the fields of ``strip_params`` removed and those of ``set_params`` set (over the
    client's values); the same bytes when there is nothing to do or the body is no JSON object."""
    if not set_params and not strip_params:
        return body
    doc = json_object(body)
    if doc is None:
        return body
    for field in strip_params:
        doc.pop(field, None)
    for field, value in set_params.items():
        doc[field] = thawed_json(value)
    return json.dumps(doc).encode()


def filtered_for(model: ModelConfig | None, body: bytes) -> bytes:
    """``body`` as the replicas of ``model`` get it (None: a model this configuration does not have, whose
    request passes unchanged)."""
    if model is None or not model.filters_body:
        return body
    return filter_body(body, model.set_params, model.strip_params)
