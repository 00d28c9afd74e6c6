"""The devices a llama-server build can use, from its ``--list-devices``.

llama-server prints ``Available devices:`` and then one line per device (``  CUDA0: NVIDIA GeForce RTX 3090
(24135 MiB, 23000 MiB free)``, ``  Vulkan0: ...``, ``  MTL0: Apple M2 ...``), or ``  (none)`` for a CPU-only
build or a host whose GPUs its backends cannot see. The router asks only when its own GPU readers found
nothing: a Metal or Vulkan GPU has no NVML, amdsmi or sysfs reading, and the build still sees it.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

log = logging.getLogger("router")

LIST_TIMEOUT = 30.0  # seconds: a backend's start (CUDA, Vulkan) can take a few
_HEADER = "Available devices:"


def parse_devices(output: str) -> tuple[str, ...] | None:
    """The device lines of a ``--list-devices`` output (``()`` for ``(none)``); None when there is no
    ``Available devices:`` list in it (an older build, or another program)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == _HEADER:
            devices = []
            for entry in lines[i + 1 :]:
                text = entry.strip()
                if not entry.startswith((" ", "\t")) or not text:
                    break
                if text != "(none)":
                    devices.append(text)
            return tuple(devices)
    return None


def listed_devices(binary: Path) -> tuple[str, ...] | None:
    """What ``binary --list-devices`` lists; None when it cannot tell (it failed, timed out, or printed no
    device list)."""
    try:
        done = subprocess.run(
            [str(binary), "--list-devices"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=LIST_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("%s --list-devices: %s", binary, exc)
        return None
    return parse_devices(done.stdout + "\n" + done.stderr)
