"""The flags a llama-server binary accepts, read from its ``--help`` once and cached per binary.

``accepted_flags(binary)`` runs ``BINARY --help`` and keeps every flag spelling of its option list
(``-ctk``, ``--cache-type-k``, ...). The result is cached in memory and on disk, under the router's home
directory as ``flags-<hash>.json`` (``router.hosts.binary_cache``), keyed by the binary's absolute path,
modification time and size, so a rebuilt binary is asked again. A binary that cannot be run, or whose
``--help`` lists no flags, gives None: the caller skips the check (one warning per binary).
``read_flags(binary)`` gives the reason instead of None, for a model's own binary, which is refused then.

``check_flags(config, binary, accepted, own)`` refuses pass-through keys of ``[defaults]`` and the model
tables that llama-server would refuse at launch, naming the key, its value and the likely fix ("did you
mean"). A model with a binary of its own (``own``) has its flags, and the ``[defaults]`` it gets, checked
against that binary's list.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from router.config.keyspec import render_value
from router.config.llama_args import ROUTER_OWNED, flag_identity, render_flag
from router.config.model_keys import DEFAULTABLE_MODEL_KEYS, MODEL_KEYS
from router.config.values import Config, ConfigError, FlagValue
from router.hosts.binary_cache import Key, binary_key, read_cached, run_binary, write_cached

log = logging.getLogger("router")

HELP_TIMEOUT = 30.0
CACHE_KIND = "flags"
# Every llama-server has this flag; a help text without it is not llama-server's option list.
REQUIRED_FLAG = "--port"

# A line of the option list: one or more flag spellings, separated by commas, then the argument and text.
_FLAG = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_.-]*(?=,|\s|$)")
_FLAG_COLUMN = re.compile(r"^(?:-{1,2}[A-Za-z][A-Za-z0-9_.-]*(?:,\s*|\s+|$))+")

# Router-owned flags → the model key that replaces them.
_OWNED_BY_KEY = {
    "parallel": "parallel",
    "ctx-size": "ctx",
    "gpu-layers": "gpu_layers",
    "model": "model",
    "device": "gpus",
    "main-gpu": "gpus",
    "cache-ram": "cram",
}
_MODEL_KEYS = tuple(spec.name for spec in MODEL_KEYS)

_memo: dict[Key, frozenset[str] | None] = {}
_why: dict[Key, str] = {}  # why the flags of a binary in _memo as None cannot be known


def parse_help(text: str) -> frozenset[str]:
    """Every flag spelling in llama-server's ``--help`` text (lines of its option list start with a dash)."""
    flags: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("---"):
            continue
        column = _FLAG_COLUMN.match(line)
        if column is not None:
            flags.update(_FLAG.findall(column.group(0)))
    return frozenset(flags)


def _run_help(binary: Path) -> tuple[frozenset[str] | None, str]:
    """The flags ``binary --help`` lists, or None and why not."""
    ran = run_binary(binary, "--help", HELP_TIMEOUT)
    if isinstance(ran, str):
        return None, f"`{binary} --help` {ran}"
    returncode, text = ran
    flags = parse_help(text)
    if REQUIRED_FLAG not in flags:
        return None, f"`{binary} --help` (exit status {returncode}) printed no llama-server flag list"
    return flags, ""


def _cached_flags(key: Key) -> frozenset[str] | None:
    data = read_cached(CACHE_KIND, key)
    flags = None if data is None else data.get("flags")
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        return None
    return frozenset(flags)


def read_flags(binary: Path) -> frozenset[str] | str:
    """The flag spellings ``binary`` accepts, from its ``--help`` (cached), or why they cannot be known."""
    try:
        key = binary_key(binary)
    except OSError as exc:
        return f"cannot read {binary}: {exc.strerror or exc}"
    if key in _memo:
        return _memo[key] or _why.get(key, f"`{binary} --help` printed no llama-server flag list")
    flags = _cached_flags(key)
    why = ""
    if flags is None:
        flags, why = _run_help(binary)
        if flags is not None:
            write_cached(CACHE_KIND, key, {"flags": sorted(flags)})
    _memo[key] = flags
    if flags is None:
        _why[key] = why
        return why
    return flags


def accepted_flags(binary: Path) -> frozenset[str] | None:
    """The flag spellings ``binary`` accepts, from its ``--help`` (cached); None when they cannot be known
    (with a warning, once per binary)."""
    try:
        key: Key | None = binary_key(binary)
    except OSError:
        key = None
    fresh = key is None or key not in _memo
    flags = read_flags(binary)
    if isinstance(flags, frozenset):
        return flags
    if fresh:
        log.warning("llama-server flags in the config are not checked: %s", flags)
    return None


def _suggestion(name: str, accepted: frozenset[str], in_model: bool) -> str:
    """The "; did you mean ...?" text for a bare key name that is no flag; "" when nothing is close."""
    flag_names = {flag.lstrip("-") for flag in accepted}
    candidates = sorted(flag_names | set(_MODEL_KEYS))
    close = difflib.get_close_matches(name, candidates, n=1)
    if not close:
        return ""
    guess = close[0]
    if guess in _MODEL_KEYS:
        if not in_model and guess in DEFAULTABLE_MODEL_KEYS:
            return f"; did you mean `{guess}`?"
        if not in_model:
            return f"; did you mean `{guess}` (a per-model key: set it in [models.NAME])?"
        return f"; did you mean `{guess}` (use the `{guess}` key)?"
    identity = flag_identity(guess)
    if identity in _OWNED_BY_KEY:
        owner = _OWNED_BY_KEY[identity]
        if in_model or owner in DEFAULTABLE_MODEL_KEYS:
            return f"; did you mean `{guess}` (use the `{owner}` key)?"
        return f"; did you mean `{guess}` (set `{owner}` per model in [models.NAME])?"
    if identity in ROUTER_OWNED:
        return f"; did you mean `{guess}`? (the router sets that one itself: {ROUTER_OWNED[identity]})"
    return f"; did you mean `{_key_for(guess, accepted)}`?"


def _key_for(name: str, accepted: frozenset[str]) -> str:
    """How to write a flag as a key so that it renders as a spelling llama-server accepts."""
    if render_flag(name) in accepted:
        return name
    dashed = next(flag for flag in (f"-{name}", f"--{name}") if flag in accepted)
    return f'"{dashed}"'


def flag_problem(key: str, accepted: frozenset[str], *, in_model: bool) -> str | None:
    """What to do about a pass-through key llama-server would refuse ("; did you mean ...?"), or None when
    it accepts the flag the key renders to."""
    written = render_flag(key)
    if written in accepted:
        return None
    name = key.lstrip("-")
    other = [flag for flag in (f"-{name}", f"--{name}") if flag in accepted and flag != written]
    if other:
        spelt = other[0]
        return f' as written (`{written}`); llama-server spells it `{spelt}`: write the key as "{spelt}"'
    return _suggestion(name, accepted, in_model) or "; remove it or correct its spelling"


def _tables(
    config: Config,
    binary: Path,
    accepted: frozenset[str] | None,
    own: Mapping[str, tuple[Path, frozenset[str]]],
) -> Iterable[tuple[str, Iterable[tuple[str, FlagValue]], bool, Path, frozenset[str], str]]:
    """(prefix, flags, in a model's table, the binary that gets them, its flags, the model whose own binary
    that is, or "")."""
    if accepted is not None:
        yield "defaults", config.defaults.items(), False, binary, accepted, ""
    for name, model in config.models.items():
        if name in own:
            their, flags = own[name]
            overridden = {flag_identity(key) for key, _ in model.extra_args}
            inherited = [(k, v) for k, v in config.defaults.items() if flag_identity(k) not in overridden]
            # `key = false` that only drops a default renders nothing: that binary need not know the flag.
            dropped = {flag_identity(key) for key in config.defaults}
            table = [(k, v) for k, v in model.extra_args if v is not False or flag_identity(k) not in dropped]
            yield "defaults", inherited, False, their, flags, name
            yield f"models.{name}", table, True, their, flags, name
        elif accepted is not None:
            yield f"models.{name}", model.extra_args, True, binary, accepted, ""


def check_flags(
    config: Config,
    binary: Path,
    accepted: frozenset[str] | None,
    own: Mapping[str, tuple[Path, frozenset[str]]] | None = None,
) -> None:
    """Raise ConfigError for the first pass-through key of [defaults] or a model that its llama-server does
    not accept: ``binary`` (whose flags are ``accepted``; None: not checked) for the models in no entry of
    ``own``, which maps a model with a binary of its own to that binary and its flags."""
    for prefix, flags, in_model, checked, known, owner in _tables(config, binary, accepted, own or {}):
        for key, value in flags:
            problem = flag_problem(key, known, in_model=in_model)
            if problem is None:
                continue
            where = f"{checked} --help"
            if owner:
                where += f", the llama_server of models.{owner}"
                if not in_model:
                    problem += f"; or set {key} = false in [models.{owner}] to leave it out there"
            raise ConfigError(
                config.path,
                f"{prefix}.{key} = {render_value(value)} is not a flag of llama-server ({where}){problem}",
                key=f"{prefix}.{key}",
            )
