"""The configuration the documentation shows is the configuration the loader accepts.

* Every fenced ```toml block of README.md and docs/**/*.md is loaded by the real loader
  (``router.config.load.load_config`` on a file holding it) and its llama-server keys are checked against the
  flags llama-server b11434 lists in its ``--help`` (``tests/support/llama-server-help.txt``, the check the
  router makes at startup). Snippets are fragments, so before loading: a snippet without any
  ``[models.NAME]`` table gets one minimal table (``model = "NAME.gguf"``) per pool member it names, or a
  single ``[models.example]`` when it names none; a file a ``*_file`` key names by a relative path (the
  loader reads those) is created beside the config with a placeholder key, and a variable a ``key_env``
  names is set to one (each its own: no two clients share a secret). Model files are not created: the
  loader does not open them (``check_model_files`` does, when a configuration is deployed).
* A snippet that is wrong on purpose carries the marker ``<!-- snippet: invalid -->`` on the line before
  its fence (blank lines between allowed); it must fail to load. A marker anywhere else is an error.
* Options the prose names exist: ``[TABLE] key`` and ``[TABLE]`` ``key``, ``key2`` mentions and
  ``router.key`` name a key of that table (``[defaults]`` and models also take llama-server flags), and
  every inline ``key = value`` that parses as TOML loads: in each table its sentence puts it in ("`x = 1`
  in `[defaults]`"), else in some table (a dotted ``router.key = value`` in that table). ``NOT_SETTINGS``
  lists the few inline assignments that are not ours on purpose, with the reason; each must still be in
  the docs and still fail.
* ``llama-router init``: its output loads, and the comment of every ``[router]`` key it shows states the
  loader's real default (a computed one in the words of the reference, checked against the path the loader
  computes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from router.cli.init_config import MAIN_KEYS
from router.config.key_specs import KEY_KEYS, SECRET_SOURCES
from router.config.keyspec import KeySpec, check_value, spec_by_name
from router.config.load import Config, ConfigError, config_from_dict, load_config
from router.config.model_keys import DEFAULTABLE_MODEL_KEYS, MODEL_KEYS
from router.config.schema import (
    DEVICE_KEYS,
    PEER_KEYS,
    POOL_KEYS,
    ROUTER_KEYS,
    RPC_DEVICE_KEYS,
    TOP_LEVEL_KEYS,
)
from router.hosts.server_flags import check_flags, flag_problem, parse_help
from router.placement.synthetic import SyntheticModel, write_header_only

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
HELP = ROOT / "tests" / "support" / "llama-server-help.txt"
ACCEPTED = parse_help(HELP.read_text(encoding="utf-8"))
BINARY = Path("llama-server")
INVALID = "<!-- snippet: invalid -->"

# Inline assignments in the docs that are not settings of ours, on purpose: text → why.
NOT_SETTINGS: Mapping[str, str] = {
    "paralel = 2": "the misspelling whose error message README quotes",
    "cost.output = 2.5": "presets.ini syntax of the original llama-router",
}

# The keys of each table a prose mention may name (models and [defaults] also take llama-server flags).
TABLE_KEYS: Mapping[str, tuple[KeySpec, ...]] = {
    "router": ROUTER_KEYS,
    "devices": DEVICE_KEYS,
    "rpc_devices": RPC_DEVICE_KEYS,
    "models": MODEL_KEYS,
    "pools": POOL_KEYS,
    "peers": PEER_KEYS,
    "defaults": tuple(spec for spec in MODEL_KEYS if spec.name in DEFAULTABLE_MODEL_KEYS),
    "keys": KEY_KEYS,
}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


# ------------------------------------------------------------------------------------------ reading the docs


@attrs.frozen
class Snippet:
    file: str
    line: int  # of the opening fence, 1-based
    text: str
    invalid: bool

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def _blocks(path: Path) -> Iterator[tuple[int, str, str, list[str]]]:
    """Every fenced block of a Markdown file: its opening line number, language, indent and lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, fence, lang = match.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        yield i + 1, lang.lower(), indent, body
        i = j + 1


def _marker_before(lines: list[str], line: int) -> bool:
    """Whether the invalid marker is on the line before line ``line`` (1-based), blank lines between."""
    k = line - 2
    while k >= 0 and not lines[k].strip():
        k -= 1
    return k >= 0 and lines[k].strip() == INVALID


def snippets(paths: tuple[Path, ...] = DOCS) -> list[Snippet]:
    found = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        for line, lang, _indent, body in _blocks(path):
            if lang == "toml":
                found.append(Snippet(_rel(path), line, "\n".join(body) + "\n", _marker_before(lines, line)))
    return found


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """The lines of a Markdown file outside fenced blocks, with their 1-based numbers."""
    inside = {n for start, _, _, body in _blocks(path) for n in range(start, start + len(body) + 2)}
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if n not in inside:
            yield n, text


def paragraphs(path: Path) -> Iterator[list[tuple[int, str]]]:
    """The prose of a Markdown file in paragraphs (a table row and a list item start one of their own)."""
    paragraph: list[tuple[int, str]] = []
    for n, text in prose(path):
        stripped = text.strip()
        if not stripped or stripped.startswith(("|", "- ", "* ", "#")) or re.match(r"\d+\. ", stripped):
            if paragraph:
                yield paragraph
            paragraph = [(n, stripped)] if stripped else []
        else:
            paragraph.append((n, stripped))
    if paragraph:
        yield paragraph


def inline_code(paths: tuple[Path, ...] = DOCS) -> Iterator[tuple[str, str, str]]:
    """(file:line, the code span, the text after it in its paragraph) for every inline code span of the
    docs; a span or a sentence may wrap over lines."""
    for path in paths:
        for paragraph in paragraphs(path):
            starts, text = [], ""
            for n, line in paragraph:
                starts.append((len(text), n))
                text += line + " "
            for match in re.finditer(r"`([^`]+)`", text):
                n = max(line for offset, line in starts if offset <= match.start())
                yield f"{_rel(path)}:{n}", match.group(1), text[match.end() :]


SNIPPETS = snippets()


# ------------------------------------------------------------------------------------------------- loading


def _walk(data: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield str(key), value
            yield from _walk(value)


def completion(data: Mapping[str, Any]) -> str:
    """The TOML text that makes a fragment a whole configuration: model tables when it has none."""
    if "models" in data:
        return ""
    names: list[str] = []
    for pool in (data.get("pools") or {}).values():
        for member in pool.get("members", ()) if isinstance(pool, Mapping) else ():
            if isinstance(member, str) and member not in names:
                names.append(member)
    tables = [f"[models.{json.dumps(name)}]\nmodel = {json.dumps(name + '.gguf')}\n" for name in names]
    return "\n" + "\n".join(tables or ['[models.example]\nmodel = "example.gguf"\n'])


def placeholder_files(data: Mapping[str, Any], directory: Path) -> None:
    """The files ``*_file`` keys name by relative paths, each holding a placeholder key of its own (no two
    clients may share a secret)."""
    for key, value in _walk(data):
        if key.endswith("_file") and isinstance(value, str) and not Path(value).expanduser().is_absolute():
            target = directory / value
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"placeholder-key-{value}\n")


def placeholder_env(data: Mapping[str, Any]) -> dict[str, str]:
    """The environment a snippet's ``key_env`` keys name, each variable holding a placeholder key of its
    own."""
    return {
        value: f"placeholder-key-{value}"
        for key, value in _walk(data)
        if key == "key_env" and isinstance(value, str)
    }


def load_snippet(text: str, directory: Path) -> Config:
    """The configuration a snippet makes, through the loader and the flag check the router runs at start."""
    path = directory / "router.toml"
    env: dict[str, str] = {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        path.write_text(text)  # the loader reports it
    else:
        placeholder_files(data, directory)
        env = placeholder_env(data)
        path.write_text(text + completion(data))
    config = load_config(path, env=env)
    check_flags(config, BINARY, ACCEPTED)
    return config


def load_document(data: Mapping[str, Any], directory: Path) -> Config:
    """Like :func:`load_snippet`, for an already parsed document."""
    document = dict(data)
    if "models" not in document:
        document.update(tomllib.loads(completion(document)))
    placeholder_files(document, directory)
    env = placeholder_env(document)
    config = config_from_dict(document, directory / "router.toml", env=env, base_dir=directory)
    check_flags(config, BINARY, ACCEPTED)
    return config


# ---------------------------------------------------------------------------------------------- snippets


def test_the_docs_hold_toml_snippets() -> None:
    assert len(SNIPPETS) >= 5, [s.where for s in SNIPPETS]
    assert any(s.file == "README.md" for s in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_every_toml_snippet_loads(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.invalid:
        with pytest.raises(ConfigError):
            load_snippet(snippet.text, tmp_path)
        return
    try:
        load_snippet(snippet.text, tmp_path)
    except ConfigError as exc:
        pytest.fail(f"{snippet.where}: the snippet does not load: {exc}\n{snippet.text}")


def test_the_marker_makes_a_snippet_one_that_must_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Wrong:\n\n" + INVALID + "\n\n```toml\n[router]\nport = 70000\n```\n\n"
        "Right, in a list:\n\n- item\n\n  ```toml\n  [router]\n  port = 8081\n  ```\n"
        "\n```sh\nnot = toml\n```\n"
    )
    wrong, right = snippets((page,))
    assert (wrong.line, wrong.invalid, right.line, right.invalid) == (5, True, 14, False)
    assert right.text == "[router]\nport = 8081\n"
    with pytest.raises(ConfigError, match=r"router\.port = 70000 is invalid"):
        load_snippet(wrong.text, tmp_path)
    assert load_snippet(right.text, tmp_path).router.port == 8081


def test_invalid_markers_sit_right_before_a_toml_fence() -> None:
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        toml_fences = {line for line, lang, _, _ in _blocks(path) if lang == "toml"}
        for n, text in enumerate(lines, 1):
            if "<!-- snippet" not in text:
                continue
            where = f"{_rel(path)}:{n}"
            assert text.strip() == INVALID, f"{where}: the only snippet marker is {INVALID}"
            following = next((k for k in range(n + 1, len(lines) + 1) if lines[k - 1].strip()), None)
            assert following in toml_fences, f"{where}: {INVALID} must come right before a ```toml fence"


# -------------------------------------------------------------------------------------- options in the prose

_TABLE = r"\[(router|defaults|devices\.N|rpc_devices\.NAME|models\.NAME|pools\.NAME|peers\.NAME|keys\.NAME)\]"
_NAME = r"[A-Za-z][\w-]*"


def option_mentions() -> list[tuple[str, str, str]]:
    """(file:line, table, key) for every ``[TABLE] key``, ``[TABLE]`` ``key``, ``key2`` and ``router.key``."""
    found = []
    for where, code, after in inline_code():
        match = re.fullmatch(rf"{_TABLE}\s+({_NAME})", code)
        if match is not None:
            table = match.group(1).split(".")[0]
            more = re.match(rf"((?:,\s*`{_NAME}`)*)", after)
            for key in [match.group(2), *re.findall(rf"`({_NAME})`", more.group(1) if more else "")]:
                found.append((where, table, key))
            continue
        match = re.fullmatch(_TABLE, code)
        following = re.match(rf"\s+`({_NAME})`((?:,\s*`{_NAME}`)*)", after)
        if match is not None and following is not None:
            table = match.group(1).split(".")[0]
            for key in [following.group(1), *re.findall(rf"`({_NAME})`", following.group(2))]:
                found.append((where, table, key))
            continue
        match = re.fullmatch(r"router\.([a-z_]+)(?:\s*=.*)?", code)
        if match is not None and not (ROOT / "router" / match.group(1)).exists():
            found.append((where, "router", match.group(1)))
    return found


MENTIONS = option_mentions()


def test_the_docs_name_options() -> None:
    assert len(MENTIONS) >= 10, MENTIONS


@pytest.mark.parametrize(("where", "table", "key"), MENTIONS, ids=[f"{w}:[{t}] {k}" for w, t, k in MENTIONS])
def test_every_option_the_docs_name_exists(where: str, table: str, key: str) -> None:
    if key in {spec.name for spec in TABLE_KEYS[table]}:
        return
    if table in ("defaults", "models"):
        problem = flag_problem(key, ACCEPTED, in_model=table == "models")
        assert problem is None, f"{where}: [{table}] {key} is no key of the router and no llama-server flag"
        return
    pytest.fail(f"{where}: [{table}] {key} is not a key of [{table}]")


def inline_settings(paths: tuple[Path, ...] = DOCS) -> list[tuple[str, str, tuple[str, ...]]]:
    """(file:line, text, tables) for every inline ``key = value`` that parses as TOML; ``tables``: those the
    prose puts it in right after it ("`kv_store = false` in `[router]`", "(or in `[defaults]`)")."""
    found = []
    for where, code, after in inline_code(paths):
        if not re.fullmatch(r"[A-Za-z_][\w.-]* = \S.*", code):
            continue
        try:
            tomllib.loads(code)
        except tomllib.TOMLDecodeError:
            continue  # a placeholder (`cram = N`, `key = value`) or another format's syntax
        clause = re.split(r"[;`]|\. ", after.replace("`[", "[").replace("]`", "]"), maxsplit=1)[0]
        tables = tuple(re.findall(r"\bin \[(\w+)(?:\.[A-Z]+)?\]", clause))
        found.append((where, code, tables))
    return found


SETTINGS = inline_settings()


def placements(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The documents an inline setting may belong to, by table: itself when it names its table
    (``router.key = ...``), else each table with its required keys filled in."""
    if set(data) <= set(TOP_LEVEL_KEYS):
        return {"itself": dict(data)}
    ((key, value),) = data.items()
    two = {"a": {"model": "a.gguf"}, "b": {"model": "b.gguf"}}
    return {
        "router": {"router": {key: value}},
        "defaults": {"defaults": {key: value}},
        "models": {"models": {"example": {"model": "example.gguf", key: value}}},
        "pools": {"models": two, "pools": {"p": {"members": ["a", "b"], key: value}}},
        "peers": {"peers": {"p": {"url": "http://10.0.0.2:8080", key: value}}},
        "devices": {"devices": {"0": {key: value}}},
        "rpc_devices": {
            "rpc_devices": {"r": {"endpoint": "127.0.0.1:50052", "memory_mib": 1000, key: value}}
        },
        "keys": {"keys": {"k": {key: value} if key in SECRET_SOURCES else {"key": "k-secret", key: value}}},
    }


def setting_problems(text: str, tables: tuple[str, ...], directory: Path) -> list[str]:
    """Why the setting does not load in each of ``tables``, or (none named) in any table ([]: it does)."""
    problems = []
    candidates = placements(tomllib.loads(text))
    for table in tables or tuple(candidates):
        try:
            load_document(candidates.get(table, candidates.get("itself", {})), directory)
        except ConfigError as exc:
            problems.append(f"[{table}]: {exc}")
        else:
            if not tables:
                return []
    return problems


def test_inline_settings_are_checked_in_the_tables_their_sentence_names(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Set `ttl = 600` on a model, `metrics = true` in `[defaults]`; `kv_store = false` on a model (or in\n"
        "`[defaults]`) for that model. Placeholders are skipped: `cram = N`, `FOO=1`.\n\n"
        "```toml\nport = 1\n```\n\n- `port = 8081` in `[router]`, `port = 8081` in `[models.NAME]`.\n"
    )
    found = inline_settings((page,))
    assert [(where.rsplit(":", 1)[1], text, tables) for where, text, tables in found] == [
        ("1", "ttl = 600", ()),
        ("1", "metrics = true", ("defaults",)),
        ("1", "kv_store = false", ("defaults",)),
        ("8", "port = 8081", ("router",)),
        ("8", "port = 8081", ("models",)),
    ]
    assert [setting_problems(text, tables, tmp_path) == [] for _, text, tables in found] == [
        True,
        True,
        True,
        True,
        False,  # port is the router's own flag
    ]


def test_the_docs_hold_inline_settings() -> None:
    assert len(SETTINGS) >= 10, SETTINGS
    written = {text for _, text, _ in SETTINGS}
    for text in NOT_SETTINGS:
        assert text in written, f"{text!r} is no longer in the docs: drop it from NOT_SETTINGS"


@pytest.mark.parametrize(
    ("where", "text", "tables"),
    SETTINGS,
    ids=[f"{w}:{t}" + "".join(f" in [{x}]" for x in tables) for w, t, tables in SETTINGS],
)
def test_every_inline_setting_loads(where: str, text: str, tables: tuple[str, ...], tmp_path: Path) -> None:
    problems = setting_problems(text, tables, tmp_path)
    if text in NOT_SETTINGS:
        assert problems, f"{where}: {text!r} loads, so it need not be in NOT_SETTINGS"
        return
    where_to = " and ".join(f"[{t}]" for t in tables) or "any table"
    assert not problems, f"{where}: `{text}` does not load in {where_to}:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------------------ init


def _init(tmp_path: Path) -> str:
    models = tmp_path / "models"
    models.mkdir()
    write_header_only(models / "tiny.gguf", SyntheticModel())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_", "HISTORY_DB"))}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "router", "init", "--models-dir", str(models)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def commented_keys(text: str) -> dict[str, tuple[str, str]]:
    """Each commented-out ``[router]`` key of init's output: (its comment, unwrapped; its ``key = value``)."""
    keys: dict[str, tuple[str, str]] = {}
    comment: list[str] = []
    in_router = False
    for line in text.splitlines():
        if line.startswith("["):
            in_router = line == "[router]"
            comment = []
            continue
        if not in_router or not line.startswith("# "):
            continue
        body = line[2:]
        match = re.fullmatch(r"([a-z_]+) = .+", body)
        if match is not None:
            keys[match.group(1)] = (" ".join(comment), body)
            comment = []
        else:
            comment.append(body)
    return keys


def expand_default(words: str, config_path: Path, env: Mapping[str, str]) -> Path:
    """A computed default in the reference's words ("$XDG_STATE_HOME/llama-router/NAME-HASH/history.db
    (XDG_STATE_HOME unset: ~/.local/state)") as the path it names for ``config_path`` in ``env``."""
    pattern, _, note = words.partition(" (")
    if env.get("XDG_STATE_HOME"):
        state = env["XDG_STATE_HOME"]
    else:
        unset = re.search(r"XDG_STATE_HOME unset: (\S+?)\)", note)
        if unset is not None:
            state = unset.group(1)
        else:  # "(~/.local/state/llama-router/logs)": the whole path spelt out
            return Path(note.rstrip(")").replace("~", env["HOME"], 1))
    resolved = config_path.resolve()
    # NAME-HASH as the reference's description of history_db spells it out: the file's name without
    # extension and 8 hex digits of the SHA-256 of its absolute path
    name_hash = f"{resolved.stem}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    return Path(
        pattern.replace("$XDG_STATE_HOME", state).replace("NAME-HASH", name_hash).replace("~", env["HOME"])
    )


def test_init_output_loads_and_states_the_loaders_defaults(tmp_path: Path) -> None:
    text = _init(tmp_path)
    path = tmp_path / "router.toml"
    path.write_text(text)
    keys = commented_keys(text)
    assert list(keys) == list(MAIN_KEYS)
    for env in (
        {"XDG_STATE_HOME": str(tmp_path / "xdg"), "HOME": "/home/u"},
        {"HOME": str(tmp_path / "home")},
    ):
        config = load_config(path, env=env)
        check_flags(config, BINARY, ACCEPTED)
        for name, (comment, line) in keys.items():
            spec = spec_by_name(ROUTER_KEYS, name)
            loaded = getattr(config.router, name)
            if spec.default is not None:  # shown at its default, which the loader uses
                written = check_value(spec, tomllib.loads(line)[name])
                assert written == spec.default == loaded, (name, line)
                continue
            assert f"Default: {spec.default_repr()}." in comment, (name, comment)
            if spec.default_repr().startswith("$XDG_STATE_HOME"):
                assert loaded == expand_default(spec.default_repr(), path, env), (name, env)
            else:
                assert loaded is None, name  # computed at start (llama_server: a PATH lookup)
    assert "~/.local/state/llama-router/history.db" not in text  # the default has NAME-HASH in it
    uncommented = re.sub(r"^# ([a-z_]+ = )", r"\1", text, flags=re.MULTILINE)
    assert tomllib.loads(uncommented)["router"].keys() == set(MAIN_KEYS)
    path.write_text(uncommented)
    load_config(path, env={})  # the example values load too
