"""The llama.cpp build of a llama-server binary, and the check that the binary takes every flag the router
itself passes to its replicas.

``read_build(binary)`` runs ``BINARY --version`` once per binary and reads the line llama.cpp prints there:
``version: 0.6.0 (build 11434, commit abcdef0)`` (builds before that format: ``version: 4585 (abcdef0)``).
The reading is cached in memory and on disk beside the flags (``build-<hash>.json``, same key: the binary's
absolute path, modification time and size; see ``router.hosts.binary_cache``). ``known_build(binary)`` is
the last reading made in this process, without running or even looking at the file: what /health and
/status answer, so that they never start a process.

``check_router_flags(binary, passed)`` refuses a binary whose ``--help`` lacks a flag the router puts on
its replicas' command lines (``--fit off``, ``--cache-ram``, ``--rpc``, ...): every load would fail with
llama-server's usage text. The refusal is :class:`LlamaServerTooOld`, one line that names the binary, its
build and :data:`router.hosts.locate.MINIMUM_LLAMA_CPP_BUILD`. A binary whose flags cannot be read is not
checked (``router.hosts.server_flags`` warns once).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from router.hosts.binary_cache import Key, binary_key, read_cached, run_binary, write_cached
from router.hosts.locate import MINIMUM_LLAMA_CPP_BUILD, LlamaServerNotFound
from router.hosts.server_flags import accepted_flags

log = logging.getLogger("router")

VERSION_TIMEOUT = 30.0
CACHE_KIND = "build"
MAX_NAMED_MODELS = 3

# "version: 0.6.0 (build 11434, commit abcdef0)"; before that, "version: 4585 (abcdef0)".
_VERSION = re.compile(
    r"^version:\s*(?P<version>\S+)\s*\(build\s+(?P<number>\d+),\s*commit\s+(?P<commit>[^\s)]+)\)", re.M
)
_OLD_VERSION = re.compile(r"^version:\s*(?P<number>\d+)\s*\((?P<commit>[^\s)]+)\)", re.M)
_FLAG_WORD = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9_.-]*")
_UNKNOWN = ("", "unknown", "0")


class LlamaServerTooOld(LlamaServerNotFound):
    """The llama-server binary lacks a flag the router passes to its replicas; the message is one line naming
    the binary, its build and the oldest build the router supports."""


@attrs.frozen
class ServerBuild:
    """A llama.cpp build: its number (b11434 → 11434) and commit; None where the binary does not say.
    ``version`` is llama.cpp's own version string, printed by newer builds ("0.6.0")."""

    number: int | None = None
    commit: str | None = None
    version: str | None = None

    def describe(self, *, commit: bool = True) -> str:
        """``build 11434, commit abcdef0``; ``build unknown`` when the number is not known."""
        text = "build unknown" if self.number is None else f"build {self.number}"
        if commit and self.commit is not None:
            text += f", commit {self.commit}"
        return text

    def as_json(self) -> dict[str, object]:
        return {"build": self.number, "commit": self.commit}


UNKNOWN_BUILD = ServerBuild()

_memo: dict[Key, ServerBuild] = {}
_last: dict[str, ServerBuild] = {}


def parse_version(text: str) -> ServerBuild:
    """The build that ``llama-server --version`` printed in ``text`` (UNKNOWN_BUILD when it printed none).
    Build number 0 and commit "unknown" are what llama.cpp prints when it was built without that
    information: they read as unknown."""
    found = _VERSION.search(text) or _OLD_VERSION.search(text)
    if found is None:
        return UNKNOWN_BUILD
    number, commit = found.group("number"), found.group("commit")
    version = found.group("version") if "version" in found.re.groupindex else None
    return ServerBuild(
        number=None if number in _UNKNOWN else int(number),
        commit=None if commit in _UNKNOWN else commit,
        version=version,
    )


def _run_version(binary: Path) -> tuple[ServerBuild, bool]:
    """The build ``binary --version`` prints, and whether the binary answered at all (worth caching)."""
    ran = run_binary(binary, "--version", VERSION_TIMEOUT)
    if isinstance(ran, str):
        log.warning("the build of %s is unknown: `--version` %s", binary, ran)
        return UNKNOWN_BUILD, False
    returncode, text = ran
    build = parse_version(text)
    if build.number is None:
        log.warning("the build of %s is unknown: `--version` (exit status %d) names none", binary, returncode)
    return build, True


def _cached_build(key: Key) -> ServerBuild | None:
    data = read_cached(CACHE_KIND, key)
    if data is None:
        return None
    number, commit, version = data.get("build"), data.get("commit"), data.get("version")
    if not (
        (number is None or (isinstance(number, int) and not isinstance(number, bool)))
        and (commit is None or isinstance(commit, str))
        and (version is None or isinstance(version, str))
    ):
        return None
    return ServerBuild(number, commit, version)


def read_build(binary: Path) -> ServerBuild:
    """The build of ``binary``, from its ``--version`` (run once per binary: cached); UNKNOWN_BUILD when it
    cannot be known."""
    try:
        key = binary_key(binary)
    except OSError:
        return UNKNOWN_BUILD
    build = _memo.get(key)
    if build is None:
        build = _cached_build(key)
        if build is None:
            build, answered = _run_version(binary)
            if answered:
                write_cached(
                    CACHE_KIND, key, {"build": build.number, "commit": build.commit, "version": build.version}
                )
        _memo[key] = build
    _last[key[0]] = build
    return build


def known_build(binary: str | Path) -> ServerBuild | None:
    """The build of ``binary`` as last read in this process (at start or reload); None when it was not read.
    Runs nothing and reads no file."""
    return _last.get(str(Path(binary).absolute()))


def flag_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The words of a command line that are flags (``--port``, ``-ngl``; not ``-1``)."""
    return tuple(word for word in argv if _FLAG_WORD.fullmatch(word))


def too_old_message(binary: Path, build: ServerBuild, flag: str, users: Sequence[str], models: int) -> str:
    """The one line that refuses ``binary``: it lacks ``flag``, which the replicas of ``users`` (out of
    ``models`` models run by this binary) get."""
    if len(users) == models:
        who = "every replica"
    else:
        named = ", ".join(f"models.{name}" for name in users[:MAX_NAMED_MODELS])
        more = len(users) - MAX_NAMED_MODELS
        who = f"the replicas of {named}" + (f" and {more} more" if more > 0 else "")
    return (
        f"llama-server {binary} ({build.describe(commit=False)}) lacks {flag}, which llama-router passes to "
        f"{who}; llama-router needs llama.cpp build b{MINIMUM_LLAMA_CPP_BUILD} or newer: update llama.cpp "
        "or point [router] llama_server at a newer binary"
    )


def check_router_flags(binary: Path, passed: Mapping[str, Sequence[str]]) -> ServerBuild | None:
    """Raise LlamaServerTooOld when ``binary`` lacks a flag the router passes; ``passed`` maps each model run
    by ``binary`` to the flags the router itself puts on its replicas' command lines. Returns the binary's
    build (read here, so that /health and /status know it), or None when its flags cannot be read (not
    checked)."""
    accepted = accepted_flags(binary)
    if accepted is None:
        return None
    build = read_build(binary)
    for flags in passed.values():
        for flag in flags:
            if flag not in accepted:
                users = [name for name, used in passed.items() if flag in used]
                raise LlamaServerTooOld(too_old_message(binary, build, flag, users, len(passed)))
    if build.number is not None and build.number < MINIMUM_LLAMA_CPP_BUILD:
        log.warning(
            "llama-server %s is %s, older than b%d, the oldest build llama-router supports; it takes every "
            "flag the router passes, so it is used",
            binary,
            build.describe(commit=False),
            MINIMUM_LLAMA_CPP_BUILD,
        )
    return build
