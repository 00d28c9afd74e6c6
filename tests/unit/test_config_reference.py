"""The configuration reference rendered from the schema: every key, well-formed tables."""

from __future__ import annotations

import re

from router.config.key_specs import KEY_KEYS
from router.config.load import reference_markdown
from router.config.model_keys import MODEL_KEYS
from router.config.schema import DEVICE_KEYS, PEER_KEYS, POOL_KEYS, ROUTER_KEYS


def test_reference_mentions_every_key() -> None:
    text = reference_markdown()
    for heading in (
        "### `[router]`",
        "### `[devices.N]`",
        "### `[defaults]`",
        "### `[models.NAME]`",
        "### `[pools.NAME]`",
        "### `[peers.NAME]`",
        "### `[keys.NAME]`",
    ):
        assert heading in text
    for spec in ROUTER_KEYS + DEVICE_KEYS + MODEL_KEYS + POOL_KEYS + PEER_KEYS + KEY_KEYS:
        assert re.search(rf"^\| `{spec.name}`", text, re.MULTILINE), spec.name
    for spec in ROUTER_KEYS:
        if spec.env:
            assert f"`{spec.env}`" in text
    port_row = next(line for line in text.splitlines() if line.startswith("| `port`"))
    assert "`8080`" in port_row and "between 0 and 65535" in port_row


def test_reference_tables_are_well_formed() -> None:
    for block in reference_markdown().split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if rows:
            widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
            assert len(widths) == 1, block
