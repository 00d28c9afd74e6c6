"""What can be checked of the Docker and Nix packaging without Docker or Nix builds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_layers_on_the_llama_cpp_server_image() -> None:
    parser = DockerfileParser(str(ROOT / "Dockerfile"))
    instructions = [i["instruction"] for i in parser.structure]
    assert parser.baseimage == "ghcr.io/ggml-org/llama.cpp:server-cuda"
    assert "HEALTHCHECK" in instructions and "ENTRYPOINT" in instructions
    users = [i["value"] for i in parser.structure if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0")
    volumes = " ".join(i["value"] for i in parser.structure if i["instruction"] == "VOLUME")
    for path in ("/models", "/configs", "/var/lib/llama-router"):
        assert path in volumes
    copied = " ".join(i["value"] for i in parser.structure if i["instruction"] == "COPY")
    for part in ("router", "statemachine", "pyproject.toml"):
        assert part in copied
        assert (ROOT / part).exists()


# Every Nix file of the project: at the top, under nix/ and under tests/ (the module's evaluation stub).
NIX_FILES = sorted(
    str(p.relative_to(ROOT))
    for p in [*ROOT.glob("*.nix"), *(ROOT / "nix").rglob("*.nix"), *(ROOT / "tests").rglob("*.nix")]
)


def test_every_nix_file_is_parsed() -> None:
    assert {"flake.nix", "nix/package.nix", "nix/module.nix", "nix/settings.nix"} <= set(NIX_FILES)


@pytest.mark.parametrize("name", NIX_FILES)
def test_nix_files_parse(name: str) -> None:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate is not installed (Debian package nix-bin)")
    result = subprocess.run([nix, "--parse", str(ROOT / name)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_nixos_module_offers_the_documented_options() -> None:
    text = (ROOT / "nix" / "module.nix").read_text()
    for option in ("enable", "host", "port", "settings", "models", "llamaCpp", "openFirewall"):
        assert f"{option} =" in text
    assert "openFirewall = lib.mkOption" in text and "default = false" in text
    assert "NoNewPrivileges = true" in text
