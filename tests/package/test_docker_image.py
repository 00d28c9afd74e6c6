"""The Docker image as its Dockerfile builds it, replayed here (tests/support/image_steps.py): the files its
COPY lines name, its pip command, its ENV, its user and volumes, its HEALTHCHECK and its ENTRYPOINT. The
router then runs as the image's unprivileged user on a real llama-server (standing in for the base image's
/app/llama-server) and must serve every page, every asset and a streamed chat, pass its health check, and
write its state only where the image gives that user a volume."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from router.shell.ports import free_port
from tests.package.conftest import Readable
from tests.support import REPO
from tests.support.image_steps import Image, replay
from tests.support.installed import (
    crawl,
    open_to_all,
    shared_dir,
    streamed_chat,
    system_python,
    toml_text,
    usable_by_others,
)
from tests.support.processes import launched

# The PATH of the base image, where python3 and the system's tools are.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STATE_VOLUME = "/var/lib/llama-router"


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def _account(image: Image, python: str) -> int | None:
    """The uid the router runs as: the image's user when this test may switch to it, else this process's."""
    if os.geteuid() != 0:
        return None
    if not usable_by_others(python):
        pytest.fail(f"{python} cannot be run by the image's user (install Debian's python3-venv)")
    return image.uid


def test_the_image_as_built_serves_every_page_and_keeps_its_state_in_its_volume(
    readable: Readable, tmp_path: Path
) -> None:
    python = system_python()
    with shared_dir("llama-router-image-") as root:
        image = replay(REPO / "Dockerfile", root, python=python, base_path=BASE_PATH)
        assert {"python3", "python3-venv"} <= set(image.apt_packages)
        assert image.user != "root" and image.uid != 0
        assert STATE_VOLUME in image.volumes
        assert image.users[image.user][1] == STATE_VOLUME, "the user's home is its state volume"
        uid = _account(image, python)
        # The base image's llama-server, and what a user mounts: a model and the configuration.
        shutil.copytree(readable.llama_server.parent, image.path("/app"), dirs_exist_ok=True)
        shutil.copy2(readable.model, image.path("/models/tiny.gguf"))
        port = free_port()
        env = image.run_env(BASE_PATH, ROUTER_PORT=str(port))
        config = Path(env["ROUTER_CONFIG_PATH"])
        model_table = {"model": str(image.path("/models/tiny.gguf")), "ctx": 1024}
        config.write_text(toml_text({"defaults": {"threads": 1}, "models": {"tiny": model_table}}))
        open_to_all(image.path("/models"))
        open_to_all(image.path("/configs"))
        before = _files(root)
        argv = [image.which(image.entrypoint[0], env), *image.entrypoint[1:]]
        url = f"http://127.0.0.1:{port}"
        log = tmp_path / "router.log"
        with launched(argv, url, log, name="the image's router", env=env, cwd=image.path("."), user=uid):
            visit = crawl(url, extra=("/chat/tiny/",))
            text = streamed_chat(url, "tiny")
            check = [image.which(image.healthcheck[0], env), *image.healthcheck[1:]]
            health = subprocess.run(check, env=env, user=uid, capture_output=True, text=True, timeout=30)
            # Stopping the replica saves its slots to the KV store (in the state volume).
            assert httpx.post(f"{url}/unload", json={}, timeout=60).status_code == 200
        written = sorted(_files(root) - before)
        logged = log.read_text(errors="replace")
    assert visit.failures() == {}
    assert len(visit.assets()) >= 10, visit.assets()
    assert health.returncode == 0, health.stderr
    state = image.path(STATE_VOLUME)
    assert [str(p) for p in written if state not in p.parents] == []
    assert Path(env["HISTORY_DB_PATH"]) in written
    kv = [p for p in written if "kv" in p.relative_to(state).parts]
    assert kv, [str(p.relative_to(state)) for p in written]
    assert "Permission denied" not in logged and "Read-only file system" not in logged, logged
    print(
        f"Docker steps: copied {image.copied}; {len(visit.pages())} pages and {len(visit.assets())} assets "
        f"and links, all 2xx; streamed chat {len(text)} characters; HEALTHCHECK exit 0; "
        f"{len(written)} files written, all under {STATE_VOLUME}"
    )
