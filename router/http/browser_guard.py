"""Browser safety: which web pages may use the router, and which ``Host`` names it answers to.

A router on 127.0.0.1 is reachable from every page the user's browser opens, so requests are judged
before anything else sees them (API keys, replicas, admin actions):

- Host (against DNS rebinding): bound to a loopback address, the router answers only ``Host`` names that
  are loopback (localhost, ``*.localhost``, 127.0.0.0/8, ``[::1]``), its own ``host``, or listed in
  ``allowed_hosts``; bound elsewhere, the check applies once ``allowed_hosts`` is set. ``"*"`` turns it off.
- Origin: a request whose ``Origin`` is neither the router's own (the host and port of its ``Host``
  header) nor listed in ``cors_origins`` gets 403. ``Origin: null`` passes only when "null" is listed.
  A request without ``Origin`` that the browser marks ``Sec-Fetch-Site: cross-site`` or ``same-site`` (an
  image, script or frame of another page, which could still load a model) gets 403 too, unless it is a
  top-level navigation or ``cors_origins`` holds ``"*"``.
- CORS: for a listed origin the router answers preflights itself and adds
  ``Access-Control-Allow-Origin: <origin>`` to its responses; every response gets ``Vary: Origin`` once
  ``cors_origins`` is set. Replicas' own CORS headers never reach the client (:func:`drop_cors`).
- Admin actions (``ADMIN_PATHS``: ``/unload``, ``/reload``, ``/models/load``, ``/models/unload``) take only
  POST with ``Content-Type: application/json`` (405, 415 otherwise), which a page on another origin cannot
  send without a preflight.

``/health`` is exempt (probes). The scheme is not compared for the router's own origin: behind a TLS
proxy the page is https while the router sees http, and only the router itself serves on its host and port.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs

from router.config.origins import DEFAULT_PORTS, _ip, canonical_origin, is_loopback_host, split_host
from router.config.values import RouterSettings
from router.http.errors import ErrorCode, HttpCode, status_of

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

OPEN_PATHS = ("/health",)
ADMIN_PATHS = ("/unload", "/reload", "/models/load", "/models/unload")
# Headers a page may send cross-origin, besides the CORS-safelisted ones; preflights may ask for more.
ALLOW_HEADERS = (
    "Authorization",
    "Content-Type",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "OpenAI-Organization",
    "OpenAI-Project",
)
ALLOW_METHODS = "GET, POST, OPTIONS"
EXPOSE_HEADERS = "x-router-model, Retry-After"
MAX_AGE = "600"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@attrs.frozen
class Refusal:
    """A request turned away before it reached anything: its code (which gives its status), why, and any
    headers the answer carries."""

    code: ErrorCode
    message: str
    headers: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def status(self) -> int:
        return status_of(self.code)


@attrs.frozen
class Verdict:
    """What to do with a request: refuse it, answer its preflight, or serve it (echoing ``cors_origin``)."""

    refusal: Refusal | None = None
    cors_origin: str | None = None
    preflight: bool = False


# ------------------------------------------------------------------------------------------- host names


@functools.lru_cache(maxsize=256)
def host_accepted(host_header: str | None, bind_host: str, allowed_hosts: tuple[str, ...]) -> bool:
    """Whether the router answers a request for ``host_header`` (see the module's rules). Remembered: a
    client sends the same Host with every request, and parsing addresses costs more than the rest of the
    request's checks (bounded, as clients choose what they send)."""
    bind = bind_host.strip().strip("[]").lower().removesuffix(".")
    if "*" in allowed_hosts or not (is_loopback_host(bind) or allowed_hosts):
        return True
    if not host_header:
        return True  # HTTP/1.0 without Host: not a browser
    parsed = split_host(host_header)
    if parsed is None:
        return False
    host = parsed[0]
    if is_loopback_host(host):
        return True
    bind_ip = _ip(bind)
    if host == bind and not (bind_ip is not None and bind_ip.is_unspecified):
        return True
    return any(
        host == h or (h.startswith(".") and (host.endswith(h) or host == h[1:])) for h in allowed_hosts
    )


# ----------------------------------------------------------------------------------------------- origins


def same_origin(origin: str, host_header: str | None) -> bool:
    """Whether ``origin`` names the host and port this request was sent to (its ``Host`` header)."""
    if not host_header:
        return False
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return False
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return False
    target = split_host(host_header)
    if target is None:
        return False
    default = DEFAULT_PORTS[scheme]
    return parts.hostname.removesuffix(".") == target[0] and (port or default) == (target[1] or default)


def origin_allowed(origin: str, cors_origins: Sequence[str]) -> bool:
    canonical = canonical_origin(origin)
    if canonical is None:
        return False
    if canonical == "null":
        return "null" in cors_origins
    return "*" in cors_origins or canonical in cors_origins


# ------------------------------------------------------------------------------------------------ verdict


def judge(
    method: str, path: str, headers: Mapping[str, str], bind_host: str, settings: RouterSettings
) -> Verdict:
    """The browser-safety decision for one request; pure, so that every rule can be tested directly."""
    headers = {k.lower(): v for k, v in headers.items()}
    if path in OPEN_PATHS:
        return Verdict()
    host = headers.get("host")
    if not host_accepted(host, bind_host, settings.allowed_hosts):
        return Verdict(refusal=_host_refusal(host or "", bind_host))
    origin = headers.get("origin")
    cors_origin: str | None = None
    if origin is not None and not same_origin(origin, host):
        if not origin_allowed(origin, settings.cors_origins):
            return Verdict(refusal=_origin_refusal(origin, host))
        cors_origin = origin.strip()
        if method == "OPTIONS" and "access-control-request-method" in headers:
            return Verdict(cors_origin=cors_origin, preflight=True)
    elif origin is None and _foreign_subresource(headers) and "*" not in settings.cors_origins:
        site = headers.get("sec-fetch-site", "")
        message = (
            f"a {site} request without an Origin header (Sec-Fetch-Site: {site}, Sec-Fetch-Mode: "
            f"{headers.get('sec-fetch-mode', '?')}) comes from another page's image, script or frame; the "
            'router refuses those unless cors_origins holds "*"'
        )
        return Verdict(refusal=Refusal(HttpCode.CROSS_SITE_NOT_ALLOWED, message))
    if path in ADMIN_PATHS:
        refusal = _admin_refusal(method, path, headers.get("content-type", ""))
        if refusal is not None:
            return Verdict(refusal=refusal, cors_origin=cors_origin)
    return Verdict(cors_origin=cors_origin)


def _foreign_subresource(headers: Mapping[str, str]) -> bool:
    if headers.get("sec-fetch-site") not in ("cross-site", "same-site"):
        return False
    navigation = headers.get("sec-fetch-mode") == "navigate" and headers.get("sec-fetch-dest") == "document"
    return not navigation


def _host_refusal(host: str, bind_host: str) -> Refusal:
    where = "a loopback address" if is_loopback_host(bind_host.strip("[]").lower()) else bind_host
    message = (
        f"Host {host!r} is not accepted: the router listens on {where} and answers only to localhost, "
        "127.0.0.1, [::1] and its own address (a page whose name points at this machine could otherwise "
        "use it); add the name to allowed_hosts ([router] allowed_hosts or ROUTER_ALLOWED_HOSTS) if it is "
        "meant to reach the router"
    )
    return Refusal(HttpCode.HOST_NOT_ALLOWED, message)


def _origin_refusal(origin: str, host: str | None) -> Refusal:
    message = (
        f"requests from pages on origin {origin!r} are not allowed: it is not the router's own origin "
        f"(host {host or '?'}) and not listed in cors_origins; add it to [router] cors_origins (or "
        "ROUTER_CORS_ORIGINS) to let such pages use the router"
    )
    return Refusal(HttpCode.ORIGIN_NOT_ALLOWED, message)


def _admin_refusal(method: str, path: str, content_type: str) -> Refusal | None:
    usage = f"send POST {path} with Content-Type: application/json and a JSON object body ({{}} will do)"
    if method != "POST":
        return Refusal(
            HttpCode.METHOD_NOT_ALLOWED, f"{method} {path} is not allowed: {usage}", {"Allow": "POST"}
        )
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        shown = content_type or "none"
        return Refusal(HttpCode.UNSUPPORTED_MEDIA_TYPE, f"Content-Type {shown!r} is not accepted: {usage}")
    return None


# ----------------------------------------------------------------------------------------------- headers


def preflight_headers(origin: str, requested: str, private_network: bool) -> dict[str, str]:
    """The answer to an allowed origin's preflight: methods, headers (the usual ones plus those asked for)."""
    names = list(ALLOW_HEADERS)
    known = {n.lower() for n in names}
    for item in requested.split(","):
        name = item.strip()
        if name and _TOKEN.match(name) and name.lower() not in known:
            names.append(name)
            known.add(name.lower())
    out = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": ", ".join(names),
        "Access-Control-Max-Age": MAX_AGE,
        "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    }
    if private_network:
        out["Access-Control-Allow-Private-Network"] = "true"
    return out


def drop_cors(headers: Mapping[str, str]) -> dict[str, str]:
    """Response headers without a replica's CORS policy (``Access-Control-*``, ``Origin`` in ``Vary``)."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        lower = key.lower()
        if lower.startswith("access-control-"):
            continue
        if lower == "vary":
            value = ", ".join(
                v.strip() for v in value.split(",") if v.strip() and v.strip().lower() != "origin"
            )
            if not value:
                continue
        out[key] = value
    return out


def with_vary(current: str | None, name: str) -> str:
    """A ``Vary`` value that names ``name`` too."""
    present = [v.strip().lower() for v in (current or "").split(",") if v.strip()]
    if name.lower() in present or "*" in present:
        return current or name
    return f"{current}, {name}" if present else name


def cors_reply_headers(headers: dict[str, str], origin: str | None, cors_origins: Sequence[str]) -> None:
    """Add to a served request's response headers (names in lower case) what the module's rules ask for."""
    if origin is not None:
        headers["access-control-allow-origin"] = origin
        headers["access-control-expose-headers"] = EXPOSE_HEADERS
    if cors_origins:
        headers["vary"] = with_vary(headers.get("vary"), "Origin")


def _add_vary(response: Response, name: str) -> None:
    response.headers["Vary"] = with_vary(response.headers.get("Vary"), name)


# ------------------------------------------------------------------------------------------------- hooks


def register_cors(app: QuartTrio, settings: Callable[[], RouterSettings]) -> None:
    """Add the CORS headers of the origin the request's admission accepted (``g.cors_origin``) to every
    response of ``app``; ``settings`` gives the current ``[router]`` settings (cors_origins follow
    reloads)."""
    # The web stack is imported here, not at the top: the configuration loader uses the checks above.
    from quart import g, request

    @app.after_request
    async def cors_headers(response: Response) -> Response:
        origin = g.get("cors_origin")
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            if "Access-Control-Allow-Methods" not in response.headers:  # not a preflight
                response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        if settings().cors_origins and request.path not in OPEN_PATHS:
            _add_vary(response, "Origin")
        return response
