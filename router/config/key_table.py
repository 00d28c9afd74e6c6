"""Validation of ``[keys.NAME]``: named clients, each with its own secret, priority class, share, scope and
rights.

A client's secret comes from exactly one of ``key``, ``key_env`` (read from the environment the loader is
given) and ``key_file`` (its first non-empty line). No message shows a secret: errors about one name the key
and, for ``key_env`` and ``key_file``, the variable or the file (``router.config.tables.secret_key``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from router.config.key_specs import KEY_KEYS, SECRET_SOURCES
from router.config.keyspec import render_value
from router.config.tables import Doc, check_name
from router.config.values import ConfigError, KeyConfig, ModelConfig, PeerConfig, PoolConfig

_ONE_SOURCE = "set exactly one of key, key_env and key_file"


def parse_keys(
    doc: Doc,
    table: Mapping[str, Any],
    env: Mapping[str, str],
    names: Collection[str],
    discovering: bool,
) -> dict[str, KeyConfig]:
    """Every ``[keys.NAME]``. ``names``: the model, pool and alias names here (a peer's listed models
    included) that ``models`` globs must match; ``discovering``: a peer discovers its models, so a glob
    may match one of them that is not known yet."""
    keys = {name: parse_key(doc, str(name), raw, env, names, discovering) for name, raw in table.items()}
    owner: dict[str, str] = {}
    for key in keys.values():
        if key.secret in owner:
            raise _shared(doc, key, f"keys.{owner[key.secret]}")
        owner[key.secret] = key.name
    return keys


def parse_key(
    doc: Doc, name: str, raw: Any, env: Mapping[str, str], names: Collection[str], discovering: bool
) -> KeyConfig:
    prefix = f"keys.{name}"
    check_name(doc, prefix, name, "a key name")
    values = doc.keys(prefix, doc.table(prefix, raw), KEY_KEYS)
    given = [source for source in SECRET_SOURCES if values[source] is not None]
    if not given:
        raise ConfigError(doc.path, f"{prefix}.key is missing: {_ONE_SOURCE}", key=f"{prefix}.key")
    if len(given) > 1:
        last = given[-1]
        raise doc.invalid(f"{prefix}.{last}", values[last], f"{prefix}.{given[0]} is set too; {_ONE_SOURCE}")
    key_env, key_file = values.pop("key_env"), values.pop("key_file")
    secret = values.pop("key")
    if key_env is not None:
        secret = _from_env(doc, f"{prefix}.key_env", key_env, env)
    if key_file is not None:
        key_file = doc.path_value(key_file)
        secret = _from_file(doc, f"{prefix}.key_file", key_file)
    models = values.pop("models")
    if models is not None and not discovering:
        _check_globs(doc, f"{prefix}.models", models, names)
    return KeyConfig(
        name=name,
        secret=secret.strip(),
        klass=values.pop("class"),
        models=models,
        key_env=key_env,
        key_file=key_file,
        **values,
    )


def _from_env(doc: Doc, key: str, variable: str, env: Mapping[str, str]) -> str:
    secret = env.get(variable, "").strip()
    if not secret:
        raise doc.invalid(
            key,
            variable,
            f"the environment variable {variable} is not set or empty; set it where the router starts, "
            "or use key_file",
        )
    return secret


def _from_file(doc: Doc, key: str, path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise doc.invalid(
            key, str(path), f"cannot be read ({reason}); fix the path or its permissions"
        ) from None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise doc.invalid(key, str(path), "holds no key: write the secret on its first non-empty line")


def _check_globs(doc: Doc, key: str, globs: Iterable[str], names: Collection[str]) -> None:
    for glob in globs:
        if not any(fnmatchcase(name, glob) for name in names):
            raise doc.invalid(
                key,
                list(globs),
                f"{glob!r} matches no model, pool or alias; names: {', '.join(sorted(names))}",
            )


def _shared(doc: Doc, key: KeyConfig, other: str) -> ConfigError:
    """The error for a client whose secret is also ``other`` (another client, or a plain key)."""
    where = f"keys.{key.name}.{key.secret_key}"
    source = key.key_env if key.key_env is not None else key.key_file
    shown = where if source is None else f"{where} = {render_value(str(source))}"
    return ConfigError(
        doc.path,
        f"{shown} is invalid: it holds the same secret as {other}; give every client a secret of its own",
        key=where,
    )


def check_plain_keys(doc: Doc, keys: Mapping[str, KeyConfig], plain: Iterable[str], where: str) -> None:
    """Refuse a client whose secret is also a plain key (of ``router.api_keys``, ``ROUTER_API_KEYS`` or
    ``router.api_keys_file``: ``where``)."""
    shared = set(plain)
    for key in keys.values():
        if key.secret in shared:
            raise _shared(doc, key, where)


def scope_names(
    models: Mapping[str, ModelConfig], pools: Mapping[str, PoolConfig], peers: Mapping[str, PeerConfig]
) -> set[str]:
    """The names a ``models`` glob may match: models, pools, their aliases and the peers' listed models."""
    names = {*models, *pools}
    for entry in (*models.values(), *pools.values()):
        names.update(entry.aliases)
    for peer in peers.values():
        names.update(peer.models)
    return names
