"""Admission: the checks every entry point makes before a request reaches the scheduler, in one order.

1. Browser safety (``browser_guard.judge``: Host, Origin, cross-site subresources, admin content types), which
   may also answer a CORS preflight.
2. The request's head: header sizes and well-formed values.
3. The API key, except for the open paths (``/health``, the pages and their files): it names the client
   (``access.identify``), whose rights the admin actions need.
4. The body (size, arrival time, JSON, field types; ``request_body``) — read by each entry point its own way.
5. The name: a model, a pool, an alias or a peer's model, or the default pool (``resolve_target``), which
   must be in the client's scope (``scope``).
6. The class: the client's, lowered when the request asks (``request_class``).
7. The key's own limits over time (``router.shell.quota``: requests_per_minute, tokens_per_day): 429.

The API's forwarding path (``router.http.forward``) and the quart app (pages, admin actions, ``/upstream``,
``/chat``) both call these functions; a refusal is an OpenAI-shaped answer that says why and what to do, and
one refused before admission is recorded in the history (``unadmitted_endpoint`` names its endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
from quart import g

from router.config.load import Config, resolve_name
from router.config.values import KeyConfig, RouterSettings
from router.http import pages
from router.http.access import ANONYMOUS, VISITOR, Client, identify, presented_key
from router.http.browser_guard import ADMIN_PATHS, Refusal, Verdict, judge
from router.http.errors import HttpCode, unknown_model_message
from router.http.request_class import request_class
from router.http.request_headers import bad_header, headers_too_large
from router.http.scope import scope_refusal
from router.shell.quota import OverLimit
from statemachine import RejectCode, RequestClass

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
    """The checks of a request's head: the browser-safety verdict (its CORS origin, a preflight), the refusal
    to answer with, if any, and the client its key names."""

    verdict: Verdict
    refusal: Refusal | None = None
    client: Client = ANONYMOUS


def check_head(
    method: str,
    path: str,
    headers: Mapping[str, str],
    pairs: Iterable[tuple[str, str]],
    *,
    bind_host: str,
    settings: RouterSettings,
    api_keys: Sequence[bytes],
    named: Mapping[str, KeyConfig],
) -> HeadCheck:
    """Steps 1-3 for one request: ``headers`` as a mapping (first value of each name), ``pairs`` every
    header as sent; ``api_keys`` the plain keys, ``named`` the clients of ``[keys.NAME]``."""
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
    client = ANONYMOUS
    if api_keys or named:
        found = identify(api_keys, named, presented_key(headers))
        if found is None and path not in OPEN_PATHS:
            return HeadCheck(verdict, Refusal(HttpCode.INVALID_API_KEY, KEY_MESSAGE, _BEARER), VISITOR)
        client = found or VISITOR
    if path in ADMIN_PATHS and not client.admin:
        message = (
            f"the key '{client.name}' may not use {path}: that needs admin = true in [keys.{client.name}]"
        )
        return HeadCheck(verdict, Refusal(HttpCode.PERMISSION_DENIED, message), client)
    return HeadCheck(verdict, client=client)


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


def check_client(
    config: Config,
    client: Client,
    target: str,
    asked: object,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    over_limit: Callable[[str], OverLimit | None],
) -> RequestClass | Refusal:
    """Steps 5 to 7 once the target is known: the refusal of a target outside the client's scope, of a
    class the request names wrongly or of a key over its own limits (``over_limit``, which counts the
    request when it is not), else the class it is served in."""
    refusal = scope_refusal(config, client, target, asked)
    if refusal is not None:
        return refusal
    klass = request_class(client, headers, body)
    if isinstance(klass, Refusal):
        return klass
    over = over_limit(client.name)
    if over is not None:
        return Refusal(HttpCode.RATE_LIMIT_EXCEEDED, over.message, over.headers)
    return klass


def current_client() -> Client:
    """The client of the quart app's current request, as admission's hook found it (none found: a visitor
    without rights, never more)."""
    client = g.get("client")
    return client if isinstance(client, Client) else VISITOR


def unadmitted_endpoint(path: str, method: str, forwarded: frozenset[str]) -> str | None:
    """The endpoint label of an API call that may have been refused before admission, else None."""
    if path in forwarded:
        return path
    if path.startswith("/upstream/"):
        return "/upstream"
    if path.startswith("/chat/") and method == "POST":
        return "/chat"
    return None
