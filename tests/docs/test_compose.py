"""The Compose files: one service built from the Dockerfile, on the Dockerfile's port, checked on a path the
app serves, every GPU reserved, and no host path in the main file (the example override adds them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from router.config.load import config_from_dict
from router.http.app import create_app
from router.http.peer_relay import PeerRelay
from router.http.proxy import Proxy
from router.http.upstream import UpstreamPool
from router.serve.server import build_router
from router.shell.views import Admin, RouterView
from tests.support.simconfig import config_document

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "docker-compose.yml"
EXAMPLE = ROOT / "docker-compose.override.yml.example"
SERVICE = "llama-router"


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def dockerfile() -> DockerfileParser:
    return DockerfileParser(str(ROOT / "Dockerfile"))


def dockerfile_values(instruction: str) -> list[str]:
    return [i["value"] for i in dockerfile().structure if i["instruction"] == instruction]


def is_host_path(source: str) -> bool:
    """Whether a volume's source names a place on the host rather than a named volume."""
    return source.startswith(("/", ".", "~", "$"))


def volume_sources(service: dict[str, Any]) -> list[str]:
    """The sources of a service's volumes, short (``SOURCE:TARGET[:MODE]``) or long syntax."""
    sources = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            sources.append("/" if volume.get("type") == "bind" else str(volume.get("source", "")))
        elif ":" in volume:
            sources.append(volume.split(":")[0])
    return sources


def test_the_main_file_builds_the_router_on_the_dockerfiles_port() -> None:
    doc = load(MAIN)
    assert list(doc["services"]) == [SERVICE]
    service = doc["services"][SERVICE]
    assert service["build"]["context"] == "."
    assert (ROOT / service["build"].get("dockerfile", "Dockerfile")).is_file()
    exposed = {int(p.split("/")[0]) for value in dockerfile_values("EXPOSE") for p in value.split()}
    targets = set()
    for port in service["ports"]:
        if isinstance(port, dict):
            targets.add(int(port["target"]))
        else:
            targets.add(int(str(port).split(":")[-1].split("/")[0]))
    assert targets and targets <= exposed, (targets, exposed)
    env = service["environment"]
    assert int(env["ROUTER_PORT"]) in targets
    assert env["ROUTER_HOST"] == "0.0.0.0"
    assert env["ROUTER_CONFIG_PATH"].startswith("/configs/")
    volumes = " ".join(dockerfile_values("VOLUME"))
    assert env["HISTORY_DB_PATH"].startswith("/var/lib/llama-router/") and "/var/lib/llama-router" in volumes


def test_every_gpu_is_reserved_and_no_host_path_is_mounted() -> None:
    doc = load(MAIN)
    service = doc["services"][SERVICE]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == "all" and "gpu" in device["capabilities"]
    assert "volumes" not in service and "volumes" not in doc
    # Nothing else reads from the host either: device files, env files, secrets or configs.
    for key in ("devices", "env_file", "secrets", "configs"):
        assert key not in service and key not in doc, key


async def test_the_healthcheck_asks_a_path_the_app_serves(tmp_path: Path) -> None:
    check = load(MAIN)["services"][SERVICE]["healthcheck"]
    command = " ".join(check["test"])
    assert check["test"][0] in ("CMD", "CMD-SHELL")
    env = load(MAIN)["services"][SERVICE]["environment"]
    found = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/.-]*)", command)
    assert found is not None, command
    assert found.group(1) == str(env["ROUTER_PORT"])
    doc = config_document(tmp_path, {"a": {}})
    config = config_from_dict(doc, tmp_path / "router.json")
    router = build_router(config)
    try:
        pool = UpstreamPool(connect_timeout=1.0, read_timeout=1.0, write_timeout=1.0)
        proxy = Proxy(RouterView(router), pool, PeerRelay(RouterView(router), router.peer_http, 1.0))
        rules = {rule.rule for rule in create_app(config, Admin(router), proxy).url_map.iter_rules()}
    finally:
        router.gpus.close()
    assert found.group(2) in rules
    assert "/props" in rules and "/status/json" in rules


def test_the_example_override_adds_the_three_paths_the_image_reads() -> None:
    doc = load(EXAMPLE)
    service = doc["services"][SERVICE]
    targets = {str(v).split(":")[1] for v in service["volumes"]}
    assert targets == {"/models", "/configs", "/var/lib/llama-router"}
    assert all(str(v).endswith(":ro") for v in service["volumes"] if ":/var/lib/" not in str(v))
    volumes = " ".join(dockerfile_values("VOLUME"))
    assert all(target in volumes for target in targets)
    assert "/docker-compose.override.yml" in (ROOT / ".gitignore").read_text().split()


def test_the_host_path_check_sees_bind_mounts() -> None:
    mounts = ["./models:/models:ro", "state:/var/lib/llama-router", "/anonymous", {"type": "bind"}]
    assert volume_sources({"volumes": mounts}) == ["./models", "state", "/"]
    assert [is_host_path(s) for s in ("./models", "/srv/m", "~/m", "${MODELS}", "state")] == [
        True,
        True,
        True,
        True,
        False,
    ]


def test_only_the_main_file_leaves_host_paths_out() -> None:
    main = load(MAIN)["services"][SERVICE]
    assert not any(is_host_path(s) for s in volume_sources(main))
    example = load(EXAMPLE)["services"][SERVICE]
    assert any(is_host_path(s) for s in volume_sources(example))


def docker_compose() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    return docker if probe.returncode == 0 else None


@pytest.mark.parametrize("files", [["docker-compose.yml"], ["docker-compose.yml", EXAMPLE.name]])
def test_docker_compose_accepts_the_files(files: list[str]) -> None:
    docker = docker_compose()
    if docker is None:
        pytest.skip("`docker compose` is not available here")
    args = [docker, "compose", "--project-directory", str(ROOT)]
    for name in files:
        args += ["-f", str(ROOT / name)]
    result = subprocess.run([*args, "config", "--quiet"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
