"""Every test carries the marker of its tier folder, so that `-m core`, `-m "not real"` and the like select
tiers: core (the pure scheduler), unit (single modules, no router running), owner (the real Router over a
fake supervisor, on a mock clock), shell (a router against the simulated llama-server), real (the real
llama-server on tiny generated models), browser (headless Chromium), docs (README, spec and packaging kept
true), package (the wheel, the sdist, the Docker steps and the NixOS service, each installed as a user
installs it). Tests elsewhere that run the real binary are marked `real`."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("core", "unit", "owner", "shell", "real", "browser", "docs", "package")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        if HERE not in path.parents:
            continue
        tier = path.relative_to(HERE).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
