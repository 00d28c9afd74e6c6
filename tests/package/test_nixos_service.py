"""The NixOS service as the module renders it: nix evaluates nix/module.nix (tests/docs/module_stub.nix in
place of nixpkgs), and the installed package's `llama-router --config` runs on the rendered configuration
with the service's environment, as an account of its own whose home is `/` (systemd's dynamic user), with
the StateDirectory the only folder it owns. The router must serve, and every file it writes — history,
replica logs, saved KV states, the cache of llama-server's flags — must land in the state directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

from router.shell.ports import free_port
from tests.package.conftest import Installed, Readable
from tests.support.installed import crawl, give_to, shared_dir, streamed_chat
from tests.support.nix_module import LLAMA_SERVER, evaluate_module
from tests.support.processes import launched

# An id in systemd's range for dynamic users.
DYNAMIC_UID = 61184


def _mapped(value: Any, old: str, new: str) -> Any:
    """``value`` with every string that starts with ``old`` starting with ``new`` instead."""
    if isinstance(value, dict):
        return {k: _mapped(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_mapped(v, old, new) for v in value]
    if isinstance(value, str) and (value == old or value.startswith(old + "/")):
        return new + value[len(old) :]
    return value


def test_the_service_keeps_every_file_it_writes_in_its_state_directory(
    installed_wheel: Installed, readable: Readable, tmp_path: Path
) -> None:
    port = free_port()
    values = {
        "enable": True,
        "port": port,
        "presetGlobals": {"threads": 1},
        "models": {"tiny": {"model": str(readable.model), "c": 1024}},
    }
    service = evaluate_module(tmp_path, values)
    state_image = f"/var/lib/{service['stateDirectory']}"
    with shared_dir("llama-router-nixos-") as root:
        state = root / service["stateDirectory"]
        state.mkdir()
        config = _mapped(service["config"], state_image, str(state))
        assert config["router"]["llama_server"] == LLAMA_SERVER
        config["router"]["llama_server"] = str(readable.llama_server)
        # The Nix store is read-only: the rendered file belongs to root.
        config_file = root / "llama-router.json"
        config_file.write_text(json.dumps(config))
        config_file.chmod(0o444)
        env = {
            "PATH": f"{installed_wheel.bin}:/usr/bin:/bin",
            "HOME": "/",
            "LANG": "C.UTF-8",
            **_mapped(service["environment"], state_image, str(state)),
        }
        uid = DYNAMIC_UID if os.geteuid() == 0 else None
        if uid is not None:
            give_to(state, uid)
        argv = [str(installed_wheel.bin / "llama-router"), "--config", str(config_file)]
        url = f"http://127.0.0.1:{port}"
        log = tmp_path / "router.log"
        with launched(argv, url, log, name="the NixOS service", env=env, cwd=Path("/"), user=uid):
            visit = crawl(url)
            text = streamed_chat(url, "tiny")
            assert httpx.post(f"{url}/unload", json={}, timeout=60).status_code == 200
        written = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
        outside = sorted(str(p) for p in root.rglob("*") if p.is_file() and state not in p.parents)
    logged = log.read_text(errors="replace")
    assert visit.failures() == {}
    assert outside == [str(config_file)]
    assert "history.db" in written
    assert any(name.startswith("logs/") for name in written), written
    assert any(name.startswith("kv/") for name in written), written
    assert any(name.startswith("cache/llama-router/flags-") for name in written), written
    assert "Permission denied" not in logged and "Read-only file system" not in logged, logged
    print(
        f"NixOS service: {len(visit.pages())} pages and {len(visit.assets())} assets and links, all 2xx; "
        f"streamed chat {len(text)} characters; written under the state directory: {written}"
    )
