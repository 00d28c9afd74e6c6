"""The peers: what each one serves and whether it is up, read from its ``/v1/models``.

One task per peer reads ``URL/v1/models`` at start, every ``refresh`` seconds and on reload. A read that
fails (no connection, a timeout, an error status, a body that is no model list) reports the peer down to the
scheduler (``PeerState``); the next good read reports it up. A peer that is down is read every
``DOWN_REFRESH`` seconds (or every ``refresh`` seconds when that is shorter). The models it lists are kept
— its own only: an entry a llama-router serves from a peer of its own carries ``peer`` and is left out, so
two routers that peer with each other do not list each other's models back — with their aliases, per-slot
context and slots, whose sum is the capacity the peer advertises (an entry with ``alias_of`` only adds a
name to a model listed on its own, so that capacity is counted once), and what each can do
(``capabilities``). When what a peer serves changes, ``on_change`` is called so that the router's settings
follow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import httpx
import trio

from router.config.values import Config, PeerConfig
from router.deploy.peer_settings import PeerModels
from statemachine import Event, PeerState

log = logging.getLogger("router.peers")

HOP_HEADER = "x-llama-router-hop"
READ_TIMEOUT = 10.0
DOWN_REFRESH = 5.0


@attrs.define
class PeerStatus:
    """What /status shows of a peer: up or down and why, when it was last read, how long that took."""

    up: bool | None = None  # None: not read yet
    reason: str = ""
    checked_at: float | None = None
    latency_s: float | None = None


def peer_headers(peer: PeerConfig) -> dict[str, str]:
    """Headers every request to ``peer`` carries: its key, and the hop mark that stops a second hop."""
    headers = {HOP_HEADER: "1"}
    if peer.api_key:
        headers["authorization"] = f"Bearer {peer.api_key}"
    return headers


def read_models(document: Any) -> PeerModels:
    """A peer's own models from its /v1/models document; raises ValueError when it is no model list.

    An entry with ``alias_of`` is another name of a model listed on its own: it adds that name to the
    model's aliases and nothing else (no model, no context, no capacity), whatever it carries."""
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise ValueError("its /v1/models is not a model list (no 'data' array)")
    names: list[str] = []
    aliases: dict[str, tuple[str, ...]] = {}
    ctx: dict[str, int] = {}
    capacity = 0
    alias_entries: list[tuple[str, str]] = []
    for entry in document["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or entry.get("peer"):
            continue
        name = entry["id"]
        if "alias_of" in entry:
            if isinstance(entry["alias_of"], str):
                alias_entries.append((name, entry["alias_of"]))
            continue
        names.append(name)
        listed = entry.get("aliases")
        if isinstance(listed, list):
            aliases[name] = tuple(a for a in listed if isinstance(a, str))
        per_slot = entry.get("ctx_per_slot")
        if isinstance(per_slot, int) and per_slot > 0:
            ctx[name] = per_slot
        slots = entry.get("slots")
        if isinstance(slots, int) and slots > 0 and "pool" not in entry:
            capacity += slots
    for alias, model in alias_entries:
        known = aliases.get(model, ())
        if model in names and alias not in known and alias not in names:
            aliases[model] = (*known, alias)
    return PeerModels(tuple(names), aliases, ctx, capacity or None)


def read_capabilities(document: Any) -> dict[str, tuple[str, ...]]:
    """What each of a peer's own models can do, as its /v1/models says (``capabilities``); a model that
    says nothing is left out."""
    found: dict[str, tuple[str, ...]] = {}
    data = document.get("data") if isinstance(document, dict) else None
    for entry in data if isinstance(data, list) else ():
        if not isinstance(entry, dict) or entry.get("peer") or "alias_of" in entry:
            continue
        name, listed = entry.get("id"), entry.get("capabilities")
        if isinstance(name, str) and isinstance(listed, list):
            found[name] = tuple(word for word in listed if isinstance(word, str))
    return found


class PeerDirectory:
    """The peers of the current configuration and what is known of them."""

    def __init__(
        self,
        config: Config,
        client: httpx.AsyncClient,
        submit: Callable[[Event], None],
        on_change: Callable[[], None],
    ) -> None:
        self.config = config
        self.client = client
        self.submit = submit
        self.on_change = on_change
        self.found: dict[str, PeerModels] = {}
        self.capabilities: dict[str, dict[str, tuple[str, ...]]] = {}  # peer → model → what it can do
        self.status: dict[str, PeerStatus] = {name: PeerStatus() for name in config.peers}
        self._wake = trio.Event()

    def reconfigure(self, config: Config) -> None:
        """A reload: forget peers no longer configured, and read every peer again now."""
        self.config = config
        self.found = {name: found for name, found in self.found.items() if name in config.peers}
        self.capabilities = {name: c for name, c in self.capabilities.items() if name in config.peers}
        self.status = {name: self.status.get(name, PeerStatus()) for name in config.peers}
        self._wake.set()

    def aliases(self) -> Mapping[str, str]:
        """Alias → model, for the models peers serve (their own aliases, as their /v1/models lists them)."""
        out: dict[str, str] = {}
        for found in self.found.values():
            for model, names in found.aliases.items():
                for alias in names:
                    out.setdefault(alias, model)
        return out

    def model_capabilities(self, model: str) -> tuple[str, ...]:
        """What a peer's model can do, as the first peer that lists it says (``()``: nothing said)."""
        for found in self.capabilities.values():
            if model in found:
                return found[model]
        return ()

    async def run(self) -> None:
        while True:
            wake = self._wake = trio.Event()
            peers = list(self.config.peers.values())
            async with trio.open_nursery() as nursery:
                for peer in peers:
                    nursery.start_soon(self._watch, peer, wake)
                await wake.wait()
                nursery.cancel_scope.cancel()

    async def _watch(self, peer: PeerConfig, wake: trio.Event) -> None:
        while not wake.is_set():
            await self.probe(peer)
            up = self.status.get(peer.name, PeerStatus()).up
            # A peer that is down is read again sooner, so that it is back in service soon after it is.
            with trio.move_on_after(peer.refresh if up else min(peer.refresh, DOWN_REFRESH)):
                await wake.wait()

    async def probe(self, peer: PeerConfig) -> None:
        """Read ``peer``'s /v1/models once and report what changed."""
        started = time.monotonic()
        timeout = httpx.Timeout(READ_TIMEOUT, connect=peer.connect_timeout)
        try:
            reply = await self.client.get(
                f"{peer.url}/v1/models", headers=peer_headers(peer), timeout=timeout
            )
            if reply.status_code != 200:
                raise ValueError(f"its /v1/models answered {reply.status_code}: {reply.text[:200]}")
            document = reply.json()
            found = read_models(document)
        except (httpx.HTTPError, ValueError) as exc:
            self._down(peer, describe_failure(exc))
            return
        self.capabilities[peer.name] = read_capabilities(document)
        status = self.status.setdefault(peer.name, PeerStatus())
        was_up = status.up
        status.up, status.reason = True, ""
        status.checked_at, status.latency_s = time.time(), round(time.monotonic() - started, 4)
        if was_up is not True:
            log.info("peer %s is up at %s: %s", peer.name, peer.url, ", ".join(found.names) or "no models")
            self.submit(PeerState(peer.name, True))
        if self.found.get(peer.name) != found:
            self.found[peer.name] = found
            self.on_change()

    def _down(self, peer: PeerConfig, reason: str) -> None:
        status = self.status.setdefault(peer.name, PeerStatus())
        was_up = status.up
        status.up, status.reason, status.checked_at, status.latency_s = False, reason, time.time(), None
        if was_up is not False:
            log.warning("peer %s (%s) is down: %s", peer.name, peer.url, reason)
        self.submit(PeerState(peer.name, False, reason))

    def describe(self) -> list[dict[str, Any]]:
        """The peers for /status."""
        out = []
        for peer in self.config.peers.values():
            status = self.status.get(peer.name, PeerStatus())
            found = self.found.get(peer.name)
            out.append(
                {
                    "name": peer.name,
                    "url": peer.url,
                    "state": "unknown" if status.up is None else ("up" if status.up else "down"),
                    "reason": status.reason or None,
                    "checked_at": status.checked_at,
                    "latency_s": status.latency_s,
                    "models": list(peer.models or (found.names if found else ())),
                    "discovered": not peer.models,
                    "advertised_capacity": found.capacity if found else None,
                }
            )
        return out


def describe_failure(exc: BaseException) -> str:
    """A peer failure in words: what went wrong, not the exception's class."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "no connection within the connect_timeout"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {READ_TIMEOUT:g} s"
    if isinstance(exc, httpx.HTTPError):
        return f"the exchange failed: {exc}"
    return str(exc)
