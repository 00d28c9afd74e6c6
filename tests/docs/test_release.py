"""The release habit (README "Releases"): the changelog opens with [Unreleased], released sections carry a
version and a date in descending order, and the one version of the package is at or above the newest release
(the Nix package reads it from pyproject.toml)."""

from __future__ import annotations

import re
import tomllib

from tests.support import REPO

HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\S+))?\s*$", re.M)
SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def _version(text: str) -> tuple[int, int, int]:
    match = SEMVER.match(text)
    assert match, f"{text!r} is not MAJOR.MINOR.PATCH"
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def test_the_changelog_opens_with_unreleased_and_releases_descend_with_dates() -> None:
    headings = list(HEADING.finditer((REPO / "CHANGELOG.md").read_text(encoding="utf-8")))
    assert headings and headings[0]["name"] == "Unreleased"
    released = headings[1:]
    for heading in released:
        assert heading["date"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", heading["date"]), heading.group(0)
    versions = [_version(h["name"]) for h in released]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)


def test_the_package_version_is_at_or_above_the_newest_release() -> None:
    with (REPO / "pyproject.toml").open("rb") as file:
        version = _version(tomllib.load(file)["project"]["version"])
    released = [m for m in HEADING.finditer((REPO / "CHANGELOG.md").read_text()) if m["name"] != "Unreleased"]
    if released:
        assert version >= _version(released[0]["name"])


def test_the_nix_package_takes_the_version_from_pyproject() -> None:
    text = (REPO / "nix" / "package.nix").read_text()
    assert "builtins.fromTOML (builtins.readFile ../pyproject.toml)).project.version" in text
    assert not re.search(r'version\s*=\s*"', text)
