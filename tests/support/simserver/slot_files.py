"""``POST /slots/{id}?action=save|restore``: a slot's cached tokens to a file under ``--slot-save-path`` and
back, in the layout llama-server writes (a magic word, a version, a count, then the token ids after the word
holding their number), so the router's reading of real state files is exercised here too. The behaviour key
``slot_save_delay`` makes both take that many seconds (a slow disk)."""

from __future__ import annotations

import os
import struct
import time
import urllib.parse

from tests.support.simserver.http_base import HandlerBase, RequestError

_MAGIC = 0x67677371  # "ggsq" read as a little-endian word
_VERSION = 4


def state_bytes(tokens: list[int]) -> bytes:
    words = [_MAGIC, _VERSION, len(tokens) + 4, 0xFFFFFFFF, 1, len(tokens), *tokens]
    return struct.pack(f"<{len(words)}I", *words) + b"\0" * (16 * len(tokens))  # the "KV data"


def tokens_of(data: bytes) -> list[int]:
    if len(data) < 24 or struct.unpack("<I", data[:4])[0] != _MAGIC:
        raise ValueError("not a slot state file")
    n = struct.unpack("<I", data[20:24])[0]
    return list(struct.unpack(f"<{n}I", data[24 : 24 + 4 * n]))


class SlotFileRoutes(HandlerBase):
    def route_slot_action(self) -> None:
        path, _, query = self.path.partition("?")
        action = urllib.parse.parse_qs(query).get("action", [""])[0]
        body = self._json_body()
        save_path = self.state.options.slot_save_path
        if not save_path:
            raise RequestError(501, "This server does not support slots action.", "not_supported_error")
        try:
            slot = self.state.pool.slots[int(path.rsplit("/", 1)[1])]
        except (ValueError, IndexError):
            raise RequestError(400, "Invalid slot ID") from None
        filename = body.get("filename")
        if not isinstance(filename, str) or not filename or "/" in filename or filename.startswith("."):
            raise RequestError(400, "Invalid filename")
        if slot.busy:
            raise RequestError(400, "slot is busy")
        time.sleep(self.state.behaviour.slot_save_delay)
        file = os.path.join(save_path, filename)
        started = time.monotonic()
        if action == "save":
            data = state_bytes(slot.cache)
            with open(file, "wb") as f:
                f.write(data)
            ms = (time.monotonic() - started) * 1000
            reply = {
                "id_slot": slot.id,
                "filename": filename,
                "n_saved": len(slot.cache),
                "n_written": len(data),
            }
            self.send_json(200, {**reply, "timings": {"save_ms": ms}})
        elif action == "restore":
            try:
                with open(file, "rb") as f:
                    data = f.read()
                tokens = tokens_of(data)
            except (OSError, ValueError, struct.error):
                raise RequestError(
                    400, "Unable to restore slot, no available space in KV cache or invalid slot save file"
                ) from None
            slot.cache = tokens
            slot.last_used = time.monotonic()
            ms = (time.monotonic() - started) * 1000
            reply = {"id_slot": slot.id, "filename": filename, "n_restored": len(tokens)}
            self.send_json(200, {**reply, "n_read": len(data), "timings": {"restore_ms": ms}})
        else:
            raise RequestError(400, "Invalid action")
