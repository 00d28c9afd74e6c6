"""The owner tier: the real Router (owner task, tickets, timer, memory check) over a fake supervisor."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.simtools import sim_launcher


@pytest.fixture(scope="session")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One simulated llama-server binary for the whole session: the deployment reads its --help once."""
    return sim_launcher(tmp_path_factory.mktemp("owner-bin"))
