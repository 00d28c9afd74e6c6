"""Admission: the checks every entry point makes before a request reaches the scheduler, in one order.

1. Browser safety (``browser_guard.judge``: Host, Origin, cross-site subresources, admin content types), which
   may also answer a CORS preflight.
2. The request's head: header sizes and well-formed values.
3. The API key, except for the open paths (``/health``, the pages and their files).
4. The body (size, arrival time, JSON, field types; ``request_body``) — read by each entry point its own way.
5. The name: a model, a pool, an alias or a peer's model, or the default pool (``resolve_target``).

The API's forwarding path (``router.http.forward``) and the quart app (pages, admin actions, ``/upstream``,
``/chat``) both call these functions; a refusal is an OpenAI-shaped answer that says why and what to do, and
one refused before admission is recorded in the history (``unadmitted_endpoint`` names its endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from router.config.load import Config, resolve_name
from router.config.values import RouterSettings
from router.http import pages
from router.http.access import key_accepted, presented_key
from router.http.browser_guard import Refusal, Verdict, judge
from router.http.errors import HttpCode, unknown_model_message
from router.http.request_headers import bad_header, headers_too_large
from statemachine import RejectCode

# /health for probes; the pages and their files hold no data (they ask for a key themselves).
OPEN_PATHS = ("/health", *pages.OPEN_PATHS)

# Endpoints whose requests go to a replica's token counter: a pool cannot answer them.
TOKEN_COUNTING = (
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
    "/v1/chat/completions/input_tokens",
)

KEY_MESSAGE = "a valid API key is required: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
_BEARER = {"WWW-Authenticate": "Bearer"}


@attrs.frozen
class HeadCheck:
    """The checks of a request's head: the browser-safety verdict (its CORS origin, a preflight) and the
    refusal to answer with, if any."""

    verdict: Verdict
    refusal: Refusal | None = None


def check_head(
    method: str,
    path: str,
    headers: Mapping[str, str],
    pairs: Iterable[tuple[str, str]],
    *,
    bind_host: str,
    settings: RouterSettings,
    api_keys: Sequence[bytes],
) -> HeadCheck:
    """Steps 1-3 for one request: ``headers`` as a mapping (first value of each name), ``pairs`` every
    header as sent."""
    verdict = judge(method, path, headers, bind_host, settings)
    if verdict.refusal is not None or verdict.preflight:
        return HeadCheck(verdict, verdict.refusal)
    pairs = list(pairs)
    too_large = headers_too_large(pairs)
    if too_large is not None:
        return HeadCheck(verdict, Refusal(HttpCode.HEADERS_TOO_LARGE, too_large, {"Connection": "close"}))
    problem = bad_header(pairs)
    if problem is not None:
        return HeadCheck(verdict, Refusal(HttpCode.INVALID_HEADER, problem))
    if api_keys and path not in OPEN_PATHS and not key_accepted(api_keys, presented_key(headers)):
        return HeadCheck(verdict, Refusal(HttpCode.INVALID_API_KEY, KEY_MESSAGE, _BEARER))
    return HeadCheck(verdict)


def resolve_target(
    config: Config, peer_model: Callable[[str], str | None], name: object, path: str
) -> tuple[str | None, Refusal | None]:
    """Step 5: the model, pool or peer model a request's ``model`` names (or the default pool), else the
    refusal naming what is served."""
    if isinstance(name, str) and name:
        target = resolve_name(config, name) or peer_model(name)
        if target is not None:
            if path in TOKEN_COUNTING and target in config.pools:
                members = ", ".join(config.pools[target].members)
                message = f"'{name}' is a pool; token counting needs one of its models: {members}"
                return None, Refusal(HttpCode.POOL_NOT_ALLOWED, message)
            return target, None
    default = config.router.default_pool
    if default is not None and path not in TOKEN_COUNTING:
        return default, None
    if not name:
        known = ", ".join(sorted((*config.models, *config.pools)))
        message = f'the request names no model; add "model" with one of: {known}'
        return None, Refusal(HttpCode.MODEL_REQUIRED, message)
    message = unknown_model_message(name, (*config.models, *config.pools))
    return None, Refusal(RejectCode.MODEL_NOT_FOUND, message)


def unadmitted_endpoint(path: str, method: str, forwarded: frozenset[str]) -> str | None:
    """The endpoint label of an API call that may have been refused before admission, else None."""
    if path in forwarded:
        return path
    if path.startswith("/upstream/"):
        return "/upstream"
    if path.startswith("/chat/") and method == "POST":
        return "/chat"
    return None
