"""The configuration reference in Markdown, rendered from the key records of router.config.schema.

README's configuration reference is this function's output; a test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.config.key_specs import KEY_KEYS
from router.config.keyspec import KeySpec
from router.config.model_keys import DEFAULTABLE_MODEL_KEYS, MODEL_KEYS
from router.config.schema import (
    CACHE_TYPES,
    DEVICE_KEYS,
    PEER_KEYS,
    POOL_KEYS,
    ROUTER_KEYS,
    RPC_DEVICE_KEYS,
)


def _table(specs: Sequence[KeySpec], *, with_env: bool) -> str:
    head = "| key | type | default | allowed | description |"
    rule = "| --- | --- | --- | --- | --- |"
    if with_env:
        head = "| key | type | default | allowed | environment | description |"
        rule = "| --- | --- | --- | --- | --- | --- |"
    rows = [head, rule]
    for spec in specs:
        name = f"`{spec.name}`" + (" (required)" if spec.required else "")
        default = spec.default_repr()
        if spec.default_text is None and spec.default is not None:
            default = f"`{default}`"
        cells = [name, spec.type, default, spec.allowed(), spec.description]
        if with_env:
            cells.insert(4, f"`{spec.env}`" if spec.env else "")
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def _defaultable_words() -> str:
    """The model keys ``[defaults]`` may set, in words: "only `cram`", "`cram` and `kv_store`"."""
    names = [f"`{name}`" for name in DEFAULTABLE_MODEL_KEYS]
    if len(names) == 1:
        return "only " + names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def reference_markdown() -> str:
    """The configuration reference in Markdown (level-3 headings), generated from the key records."""
    parts = [
        "The file is TOML, or JSON with the same structure when its name ends in `.json`. Relative paths "
        "start at the directory of the config file. In JSON, `null` counts as an absent key. Unknown keys "
        "in `[router]`, `[devices.N]`, `[rpc_devices.NAME]`, `[pools.NAME]`, `[peers.NAME]` and "
        "`[keys.NAME]` are errors. No message shows the value of an API key.",
        "",
        "### `[router]`",
        "",
        "Environment variables override the file; an empty variable counts as unset.",
        "",
        _table(ROUTER_KEYS, with_env=True),
        "",
        "### `[devices.N]`",
        "",
        "One table per GPU id N (0, 1, ...); all keys optional.",
        "",
        _table(DEVICE_KEYS, with_env=False),
        "",
        "### `[rpc_devices.NAME]`",
        "",
        "One table per device another machine lends through llama.cpp's `rpc-server` (see Several "
        "machines); models list the names in their `rpc` key. Both keys are required.",
        "",
        _table(RPC_DEVICE_KEYS, with_env=False),
        "",
        "### `[defaults]`",
        "",
        "llama-server flags applied to every model; a model's own flags win. See the pass-through rules "
        "under `[models.NAME]`. Of the model keys, "
        + _defaultable_words()
        + " may be set here too, for every model that does not set its own.",
        "",
        "### `[models.NAME]`",
        "",
        _table(MODEL_KEYS, with_env=False),
        "",
        "Any other key is passed to llama-server: `key = value` becomes `--key value` (`-k value` for "
        "single-letter and known short names such as `ctk`; keys written with dashes are used as written), "
        "`true` becomes the bare flag, `false` leaves the flag out (also one set in `[defaults]`), a list "
        "repeats the flag once per item. Flags the router sets itself are refused: `host`, `port`, "
        "`m`/`model` (use `model`), `c`/`ctx-size` (use `ctx`), `np`/`parallel` (use `parallel`), "
        "`ngl`/`gpu-layers`/`n-gpu-layers` (use `gpu_layers`), `cache-ram`/`-cram` (use the `cram` key), "
        "`fit` (always `--fit off`: weights never spill to the CPU), `api-key`/`api-key-file`, "
        "`models-dir`/`models-max`, `rpc` (use `[rpc_devices.NAME]` and the `rpc` key), and "
        "`device`/`dev` and "
        "`main-gpu`/`mg` (each replica sees only its model's GPUs, renumbered from 0: use `gpus`). "
        "Replicas start in the config file's directory, so relative paths in flag values (`mmproj`, "
        "`model-draft`, ...) start there too. At startup and on every reload each key is checked against "
        "the flags the configured llama-server lists in its `--help` (read once per binary and cached): a "
        "key it does not accept is an error with the closest flag or key (`paralel` → `parallel`); a binary "
        "whose `--help` lists no flags skips the check with a warning. "
        "`cache-type-k`/`ctk` and `cache-type-v`/`ctv` must be one of "
        + ", ".join(f"`{t}`" for t in CACHE_TYPES)
        + " (or `false`, which drops a default and leaves llama-server's `f16`).",
        "",
        "### `[pools.NAME]`",
        "",
        _table(POOL_KEYS, with_env=False),
        "",
        "Model names, pool names and all aliases share one namespace: each name may be used once. A pool "
        "member may also name a model of a peer (below).",
        "",
        "### `[peers.NAME]`",
        "",
        _table(PEER_KEYS, with_env=False),
        "",
        "A peer's models are served here under their own names and aliases (a name a local model or pool "
        'has stays theirs) and may be pool members. See "Several machines".',
        "",
        *_keys_section(),
    ]
    return "\n".join(parts)


def _keys_section() -> list[str]:
    return [
        "### `[keys.NAME]`",
        "",
        "One table per named client: NAME is what the router knows it by, its secret is never shown. "
        "Exactly one of `key`, `key_env` and `key_file` is set. Once any key is configured (here or in "
        "`router.api_keys`), requests need one; the keys of `router.api_keys` stay valid as anonymous "
        '`standard` clients with every right. See "Clients, classes and scopes".',
        "",
        _table(KEY_KEYS, with_env=False),
        "",
    ]


START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"


def embed_in(text: str) -> str:
    """``text`` (a README) with the configuration reference placed between the two markers."""
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_markdown()}\n{END}{tail}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    readme = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    readme.write_text(embed_in(readme.read_text(encoding="utf-8")), encoding="utf-8")
