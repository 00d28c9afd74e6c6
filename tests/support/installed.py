"""The router as its users install it, for the package tier: distributions built with the standard build
frontend, fresh virtualenvs outside the checkout, and what a new user's first visit does (every page, every
asset a page names, one streamed chat).

Installs that a test runs as an unprivileged account (the Docker image's user, the NixOS service's dynamic
user) live in world-readable folders made here (``shared_dir``), with a Python that account can run
(``system_python``): a test process's own interpreter may sit in a home folder no one else may enter.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import attrs
import httpx

from tests.support import REPO

# The pages a user opens first; each page's links, stylesheets and scripts are followed from there.
START_PAGES = ("/dash", "/chat", "/talk", "/translate")
PIP_TIMEOUT = 900.0


@attrs.frozen
class Distributions:
    """What ``python -m build`` made: the sdist, the wheel built from that sdist, and a wheel built straight
    from the source tree (``--wheel``), which must hold the same files."""

    sdist: Path
    wheel: Path
    tree_wheel: Path


def run(argv: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    """Run a command to completion; fail the test with its output when it fails."""
    done = subprocess.run(
        argv,
        cwd=None if cwd is None else str(cwd),
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def build_distributions(out: Path) -> Distributions:
    """Build the sdist and a wheel from it, and a wheel from the tree, the way a packager does."""
    run([sys.executable, "-m", "build", "--outdir", str(out / "dist"), str(REPO)])
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out / "tree"), str(REPO)])
    (sdist,) = (out / "dist").glob("*.tar.gz")
    (wheel,) = (out / "dist").glob("*.whl")
    (tree_wheel,) = (out / "tree").glob("*.whl")
    return Distributions(sdist, wheel, tree_wheel)


def wheel_contents(wheel: Path) -> dict[str, str]:
    """Each file of a wheel and the sha256 of its bytes."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name: hashlib.sha256(archive.read(name)).hexdigest()
            for name in archive.namelist()
            if not name.endswith("/")
        }


def system_python() -> str:
    """A Python that any account can run and that can make virtualenvs: the distribution's /usr/bin/python3
    where it has venv and ensurepip (what the Docker image installs), else this interpreter."""
    candidate = "/usr/bin/python3"
    if os.access(candidate, os.X_OK):
        probe = subprocess.run(
            [candidate, "-c", "import ensurepip, venv"], capture_output=True, check=False, timeout=60
        )
        if probe.returncode == 0:
            return candidate
    return sys.executable


def usable_by_others(python: str) -> bool:
    """Whether an unprivileged account can run ``python`` (every folder above it can be entered)."""
    path = Path(python).resolve()
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


@contextlib.contextmanager
def shared_dir(prefix: str) -> Iterator[Path]:
    """A new folder under the system's temporary folder that every account may enter and read."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp" if Path("/tmp").is_dir() else None))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_venv(folder: Path, python: str) -> Path:
    """A fresh virtualenv at ``folder`` (no access to the test's packages); returns its python."""
    run([python, "-m", "venv", str(folder)])
    return folder / "bin" / "python"


def clean_env(home: Path, path: str, **extra: str) -> dict[str, str]:
    """The environment of an installed router: a PATH, a home and a locale, nothing of the test process
    (no PYTHONPATH that could reach the checkout)."""
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8"}
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CERT"):
        if name in os.environ:
            env[name] = os.environ[name]
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def imported_from(python: Path, cwd: Path, env: Mapping[str, str]) -> Path:
    """Where ``python`` imports the router package from, run in ``cwd``."""
    out = run([str(python), "-c", "import router; print(router.__file__)"], cwd=cwd, env=env)
    return Path(out.strip())


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.links.append(value)


def page_links(html: str) -> list[str]:
    """Every src and href of a page, as written."""
    parser = _Links()
    parser.feed(html)
    return parser.links


@attrs.frozen
class Crawl:
    """What a visit fetched: each URL's status, and for each page the URLs it names."""

    statuses: dict[str, int]
    named: dict[str, list[str]]

    def failures(self) -> dict[str, int]:
        return {url: status for url, status in self.statuses.items() if status >= 400}

    def pages(self) -> list[str]:
        return sorted(self.named)

    def assets(self) -> list[str]:
        return sorted({url for urls in self.named.values() for url in urls} - set(self.named))


def crawl(base_url: str, start: tuple[str, ...] = START_PAGES, *, extra: tuple[str, ...] = ()) -> Crawl:
    """Fetch the start pages (and ``extra`` ones) and, following them, every page, stylesheet, script and
    link of this origin that a page names, each once, following redirects."""
    origin = urlsplit(base_url).netloc
    statuses: dict[str, int] = {}
    named: dict[str, list[str]] = {}
    queue = [urljoin(base_url, path) for path in (*start, *extra)]
    with httpx.Client(timeout=60.0, follow_redirects=True) as client:
        while queue:
            url = queue.pop(0)
            if url in statuses:
                continue
            response = client.get(url)
            statuses[url] = response.status_code
            if str(response.url) != url:
                statuses[str(response.url)] = response.status_code
            if not response.headers.get("content-type", "").startswith("text/html"):
                continue
            links = []
            for link in page_links(response.text):
                target = urljoin(str(response.url), link).split("#", 1)[0]
                parts = urlsplit(target)
                if parts.scheme in ("http", "https") and parts.netloc == origin:
                    links.append(target)
                    queue.append(target)
            named[str(response.url)] = links
    return Crawl(statuses, named)


def streamed_chat(base_url: str, model: str, headers: Mapping[str, str] | None = None) -> str:
    """One streamed chat completion; returns its text after checking the stream's shape."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "stream": True,
    }
    text: list[str] = []
    events: list[str] = []
    with (
        httpx.Client(timeout=120.0) as client,
        client.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read().decode(errors="replace")
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
    assert events and events[-1] == "[DONE]", events[-3:]
    for data in events[:-1]:
        chunk: dict[str, Any] = json.loads(data)
        assert chunk["object"] == "chat.completion.chunk", chunk
        for choice in chunk["choices"]:
            text.append(choice["delta"].get("content") or "")
    assert len(events) > 2, events
    return "".join(text)


def give_to(path: Path, uid: int) -> None:
    """``chown -R uid:uid path`` (a test run as root playing an account)."""
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)
    os.chown(path, uid, uid)


def files_under(path: Path) -> list[str]:
    """Every file under ``path``, relative to it, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def toml_text(doc: Mapping[str, Mapping[str, Any]]) -> str:
    """A configuration document as TOML, the way a user writes one: ``[router]``, ``[defaults]``,
    ``[models.NAME]`` (tables of scalars and lists)."""
    lines: list[str] = []
    for table, body in doc.items():
        nested = {k: v for k, v in body.items() if isinstance(v, Mapping)}
        plain = {k: v for k, v in body.items() if not isinstance(v, Mapping)}
        if plain or not nested:
            lines.append(f"[{table}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in plain.items()]
            lines.append("")
        for name, inner in nested.items():
            lines.append(f"[{table}.{json.dumps(name)}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in inner.items()]
            lines.append("")
    return "\n".join(lines)


def open_to_all(path: Path) -> None:
    """``chmod -R a+rX path``: every account may read it and enter its folders."""
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            full = os.path.join(root, name)
            mode = os.stat(full).st_mode
            os.chmod(full, mode | 0o444 | (0o111 if mode & 0o100 else 0))
    os.chmod(path, 0o755)
