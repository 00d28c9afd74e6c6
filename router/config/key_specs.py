"""The key records of a client's table, ``[keys.NAME]``: a named API key with its priority class, its share,
the models it may use and its rights.

Part of the configuration schema (``router.config.schema`` holds the other tables): one
:class:`~router.config.keyspec.KeySpec` per key, validated by ``router.config.key_table`` and rendered into
the configuration reference by ``router.config.reference``.
"""

from __future__ import annotations

from router.config.keyspec import BOOLEAN, INTEGER, PATH, STRING, STRING_LIST, KeySpec

# The priority classes, first served first (statemachine.RequestClass by label, in its order).
CLASSES: tuple[str, ...] = ("interactive", "standard", "batch")
DEFAULT_CLASS = "standard"
# Where a key's secret comes from: exactly one of these is set.
SECRET_SOURCES: tuple[str, ...] = ("key", "key_env", "key_file")

KEY_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "key",
        STRING,
        None,
        "The secret itself, written in the file. Exactly one of `key`, `key_env` and `key_file` is set; no "
        "two keys (nor a key and an entry of `router.api_keys` or `router.api_keys_file`) share a secret. "
        "Messages never show it.",
    ),
    KeySpec(
        "key_env",
        STRING,
        None,
        "The environment variable that holds the secret, read at start and on every reload; it must be "
        "set and not empty.",
    ),
    KeySpec(
        "key_file",
        PATH,
        None,
        "A file whose first non-empty line is the secret (relative paths start at the config file's "
        "directory), read at start and on every reload.",
    ),
    KeySpec(
        "class",
        STRING,
        DEFAULT_CLASS,
        "Priority class of the key's requests: waiting `interactive` requests go first, then `standard`, "
        "then `batch`; a request that has waited its class's `max_wait_*` goes before all. A request may "
        "lower its own class (`x-router-class` header, `service_tier` field), never raise it.",
        choices=CLASSES,
    ),
    KeySpec(
        "weight",
        INTEGER,
        1,
        "The key's share among the keys of its class that keep requests waiting for the same capacity: a "
        "key of weight 2 gets twice as many of them served as a key of weight 1. Keys without a table "
        "weigh 1.",
        1,
    ),
    KeySpec(
        "models",
        STRING_LIST,
        None,
        "What the key may use: shell-style globs (`*`, `?`, `[abc]`, case-sensitive) over model names, pool "
        "names and aliases; a model or pool is in scope when a glob matches its name or one of its "
        "aliases, and a pool needs at least one of its members in scope too. Other names get 403 "
        "`permission_denied`, and `/v1/models` lists only what is in scope. Each glob must match a model, "
        "pool or alias (or a peer's listed model).",
        default_text="all",
        rule="a list of non-empty globs, each matching a name",
    ),
    KeySpec(
        "admin",
        BOOLEAN,
        False,
        "Allows the admin actions, `POST /reload`, `POST /unload`, `POST /models/load` and "
        "`POST /models/unload`; any other named key gets 403 "
        "`permission_denied` there. Keys of `router.api_keys` always may.",
    ),
    KeySpec(
        "requests_per_minute",
        INTEGER,
        None,
        "Most requests the key may send in any 60 s; beyond it 429 `rate_limit_exceeded` with `Retry-After`.",
        1,
    ),
    KeySpec(
        "tokens_per_day",
        INTEGER,
        None,
        "Most tokens (prompt and completion, from the replies' usage) the key may use in any 24 h; beyond it "
        "429 `rate_limit_exceeded` with `Retry-After`.",
        1,
    ),
    KeySpec(
        "max_queued",
        INTEGER,
        None,
        "Most requests of the key that may wait in the queue at once; beyond it 429 `key_queue_full`. Unset: "
        "half of `queue_limit` where two or more named keys are configured, else only `queue_limit`.",
        1,
    ),
)
