"""The simulator's log: whole lines on standard error, as llama-server writes them."""

from __future__ import annotations

import os
import threading

_LOG_LOCK = threading.Lock()


def log(line: str) -> None:
    with _LOG_LOCK:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
