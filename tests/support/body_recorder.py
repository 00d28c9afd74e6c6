"""A llama-server stand-in that keeps every request body it receives: the simulated llama-server, run by a
launcher that first wraps its body reading. A test reads what a replica got, byte for byte.

``recording_launcher(dir, name)`` writes the executable ``dir/name``; each process it starts appends one
JSON line per request with a body to ``dir/name.bodies/<pid>.jsonl``: ``{"path": ..., "body": ...}``, the
body as Latin-1 text (``received(...)`` gives the bytes back). The launcher's own path is a binary of its
own, so a model's ``llama_server`` can name it.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import attrs

from tests.support import REPO


@attrs.frozen
class Received:
    path: str
    body: bytes

    def json(self) -> dict[str, object]:
        doc = json.loads(self.body)
        assert isinstance(doc, dict)
        return doc


def bodies_dir(launcher: Path) -> Path:
    return launcher.with_name(launcher.name + ".bodies")


def recording_launcher(dir: Path, name: str = "recording-llama-server") -> Path:
    """Write the launcher ``dir/name`` (see the module doc) and return its path."""
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / name
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, threading\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support.simserver import main\n"
        "from tests.support.simserver.http_base import HandlerBase\n"
        f"folder = {str(bodies_dir(path))!r}\n"
        "lock = threading.Lock()\n"
        "read = HandlerBase._read_body\n"
        "def recorded(self):\n"
        "    body = read(self)\n"
        "    if self.command == 'POST':\n"
        "        line = json.dumps({'path': self.path, 'body': body.decode('latin-1')}) + '\\n'\n"
        "        with lock:\n"
        "            os.makedirs(folder, exist_ok=True)\n"
        "            with open(os.path.join(folder, f'{os.getpid()}.jsonl'), 'a') as out:\n"
        "                out.write(line)\n"
        "    return body\n"
        "HandlerBase._read_body = recorded\n"
        "raise SystemExit(main(sys.argv))\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def received(launcher: Path) -> list[Received]:
    """Every body the processes of ``launcher`` received, in the order each process got them (processes in
    the order of their files' names)."""
    out = []
    for file in sorted(bodies_dir(launcher).glob("*.jsonl")):
        for line in file.read_text().splitlines():
            entry = json.loads(line)
            out.append(Received(entry["path"], entry["body"].encode("latin-1")))
    return out
