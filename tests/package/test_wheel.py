"""The distributions as a user installs them: the sdist and the wheel built with the standard frontend hold
every module and every page file, the sdist builds the same wheel as the tree, and the wheel, installed into
a fresh virtualenv outside the checkout and started from an unrelated folder, serves every page, every asset
the pages name and a streamed chat from a real llama-server."""

from __future__ import annotations

import tarfile
from pathlib import Path

from router.shell.ports import free_port
from tests.package.conftest import Installed, Readable
from tests.support import REPO
from tests.support.installed import (
    START_PAGES,
    Distributions,
    clean_env,
    crawl,
    files_under,
    imported_from,
    streamed_chat,
    toml_text,
    wheel_contents,
)
from tests.support.processes import launched

STATIC = REPO / "router" / "http" / "static"


def test_the_sdist_builds_the_wheel_the_tree_builds(distributions: Distributions) -> None:
    from_sdist = wheel_contents(distributions.wheel)
    assert from_sdist == wheel_contents(distributions.tree_wheel)


def test_the_wheel_holds_every_module_and_every_page_file(distributions: Distributions) -> None:
    files = set(wheel_contents(distributions.wheel))
    sources = {
        str(p.relative_to(REPO))
        for package in ("router", "statemachine")
        for p in (REPO / package).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sources, "no sources found"
    assert sorted(sources - files) == []
    assert {f"router/http/static/{name}" for name in files_under(STATIC)} <= files


def test_the_sdist_holds_what_building_from_it_needs(distributions: Distributions) -> None:
    with tarfile.open(distributions.sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md"} <= names
    assert {f"router/http/static/{name}" for name in files_under(STATIC)} <= names


def test_the_installed_wheel_serves_every_page_and_a_chat(
    installed_wheel: Installed, readable: Readable, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    home = tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    env = clean_env(home, f"{installed_wheel.bin}:/usr/local/bin:/usr/bin:/bin")
    # The package comes from the virtualenv, not from the checkout.
    assert installed_wheel.venv in imported_from(installed_wheel.python, elsewhere, env).parents
    port = free_port()
    doc = {
        "router": {"port": port, "llama_server": str(readable.llama_server)},
        "defaults": {"threads": 1},
        "models": {"tiny": {"model": str(readable.model), "ctx": 1024}},
    }
    config = elsewhere / "config.toml"
    config.write_text(toml_text(doc))
    url = f"http://127.0.0.1:{port}"
    argv = [str(installed_wheel.python), "-m", "router", "--config", "config.toml"]
    with launched(argv, url, tmp_path / "router.log", name="the installed router", env=env, cwd=elsewhere):
        visit = crawl(url, extra=("/chat/tiny/",))
        text = streamed_chat(url, "tiny")
    assert visit.failures() == {}
    pages = {url + page for page in START_PAGES}
    assert pages <= set(visit.pages())
    assets = visit.assets()
    for name in files_under(STATIC):
        if not name.endswith(".html"):
            assert any(a.endswith("/" + name) for a in assets), (name, assets)
    assert isinstance(text, str)
    # The state the router keeps went to the user's state folder, not to the checkout or the working folder.
    state = home / ".local" / "state" / "llama-router"
    assert list(state.glob("config-*/history.db")), files_under(home)
    assert files_under(elsewhere) == ["config.toml"]
    print(
        f"wheel install: {len(visit.pages())} pages, {len(assets)} assets and links, all 2xx; "
        f"streamed chat {len(text)} characters"
    )
