"""What a client may use: its key's ``models`` globs (``[keys.NAME] models``) over model names, pool names and
aliases.

A model (or a peer's model) is in scope when a glob matches its name, one of its aliases, or the name the
request used for it. A pool is in scope when a glob matches the pool by one of its names and at least one
of its members is in scope; the members outside the scope never serve that client's requests (the
scheduler is told which, INV-SCOPE). A request for anything else is refused with 403 ``permission_denied``,
and ``/v1/models`` leaves it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any

from router.config.values import Config
from router.http.access import Client
from router.http.browser_guard import Refusal
from router.http.errors import HttpCode


def covers(scope: Sequence[str] | None, names: Iterable[str]) -> bool:
    """Whether a glob of ``scope`` (None: everything) matches one of ``names``."""
    if scope is None:
        return True
    return any(fnmatchcase(name, glob) for name in names for glob in scope)


def names_of(config: Config, target: str) -> tuple[str, ...]:
    """A model's or pool's name and aliases (a peer's model: its name)."""
    entry = config.models.get(target) or config.pools.get(target)
    return (target,) if entry is None else (target, *entry.aliases)


def members_in_scope(config: Config, client: Client, pool: str) -> tuple[str, ...]:
    return tuple(m for m in config.pools[pool].members if covers(client.scope, names_of(config, m)))


def out_of_scope(config: Config, client: Client, members: Iterable[str]) -> frozenset[str]:
    """The pool ``members`` (the scheduler's, peers' models included) that ``client`` may not use: the
    scheduler never serves the client's request with them."""
    if client.scope is None:
        return frozenset()
    return frozenset(m for m in members if not covers(client.scope, names_of(config, m)))


def usable(config: Config, client: Client, target: str, asked: str | None = None) -> bool:
    """Whether ``client`` may send requests to ``target`` (a canonical model, pool or peer model name),
    asked for by the name ``asked``."""
    if client.scope is None:
        return True
    names = (*names_of(config, target), *((asked,) if asked else ()))
    if not covers(client.scope, names):
        return False
    # A pool is refused only when none of its members is in scope; the members outside it are skipped when
    # the scheduler picks one (``out_of_scope``, sent with the request).
    return target not in config.pools or bool(members_in_scope(config, client, target))


def scope_refusal(config: Config, client: Client, target: str, asked: object) -> Refusal | None:
    """None when ``client`` may use ``target``, else the 403 that says why and where its scope is set."""
    name = asked if isinstance(asked, str) and asked else target
    if usable(config, client, target, name):
        return None
    where = f"keys.{client.name}.models"
    if target in config.pools and covers(client.scope, (*names_of(config, target), name)):
        members = ", ".join(config.pools[target].members)
        message = (
            f"the key '{client.name}' may use the pool '{name}' but none of its members ({members}); "
            f"add one to {where}"
        )
        return Refusal(HttpCode.PERMISSION_DENIED, message)
    message = f"the key '{client.name}' may not use '{name}'; {where} says what it may use (see /v1/models)"
    return Refusal(HttpCode.PERMISSION_DENIED, message)


def entry_target(entry: dict[str, Any]) -> tuple[str, str]:
    """The model, pool or peer's model a ``/v1/models`` entry describes, and the name it is listed under
    (an alias entry's ``alias_of`` and ``id``)."""
    name = str(entry.get("id", ""))
    target = entry.get("alias_of")
    return (target if isinstance(target, str) else name), name


def visible(config: Config, client: Client, entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``/v1/models`` entries that ``client`` may use: an entry by its ``id``, an alias entry when the
    client may use its model by that alias."""
    return [entry for entry in entries if usable(config, client, *entry_target(entry))]
