"""What the package tier's tests share, built once per run: the distributions, the wheel installed into a
fresh virtualenv outside the checkout, and copies of the llama-server binary and a tiny model that any
account may read (the Docker and NixOS tests run the router as an unprivileged account)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.support.installed import (
    Distributions,
    build_distributions,
    clean_env,
    make_venv,
    open_to_all,
    run,
    shared_dir,
    system_python,
)
from tests.support.realenv import require_llama_server, tiny_model


@attrs.frozen
class Installed:
    """A virtualenv with the package installed the way a user installs it."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


@attrs.frozen
class Readable:
    """A llama-server binary and a tiny model in a folder every account may read."""

    llama_server: Path
    model: Path


@pytest.fixture(scope="session")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> Distributions:
    return build_distributions(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def installed_wheel(distributions: Distributions) -> Iterator[Installed]:
    with shared_dir("llama-router-wheel-") as root:
        python = make_venv(root / "venv", system_python())
        env = clean_env(root, f"{python.parent}:/usr/local/bin:/usr/bin:/bin")
        run([str(python), "-m", "pip", "install", "-q", str(distributions.wheel)], env=env, cwd=root)
        yield Installed(root / "venv")


@pytest.fixture(scope="session")
def readable() -> Iterator[Readable]:
    binary = require_llama_server()
    model = tiny_model()
    with shared_dir("llama-router-readable-") as root:
        # The whole folder: a shared build keeps its libraries beside the binary.
        shutil.copytree(binary.parent, root / "bin")
        open_to_all(root / "bin")
        copied = root / "bin" / binary.name
        shared = root / "tiny.gguf"
        shutil.copy2(model, shared)
        shared.chmod(0o644)
        yield Readable(copied, shared)
