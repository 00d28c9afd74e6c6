"""The configuration schema as data: one :class:`~router.config.keyspec.KeySpec` record per key, table by
table.

Every table of the configuration file is described by a tuple of KeySpec records (``router.config.keyspec``
holds the record and the checks derived from it; ``router.config.model_keys`` the records of a model's
table, the longest). The loader in ``router.config.load`` validates plain keys
against them, and :func:`router.config.reference.reference_markdown` renders the same records as the
configuration reference, so the documentation and the checks cannot drift apart.
"""

from __future__ import annotations

from router.config.keyspec import BOOLEAN, INTEGER, NUMBER, PATH, STRING, STRING_LIST, KeySpec
from router.config.scheduling_keys import SCHEDULING_KEYS

# What llama.cpp accepts for --cache-type-k / --cache-type-v.
CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

TOP_LEVEL_KEYS: tuple[str, ...] = (
    "router",
    "devices",
    "defaults",
    "models",
    "pools",
    "peers",
    "rpc_devices",
    "keys",
)

ROUTER_KEYS: tuple[KeySpec, ...] = (
    KeySpec("host", STRING, "127.0.0.1", "Address the router listens on.", env="ROUTER_HOST"),
    KeySpec(
        "port",
        INTEGER,
        8080,
        "TCP port the router listens on; 0 picks a free port.",
        0,
        65535,
        env="ROUTER_PORT",
    ),
    KeySpec(
        "llama_server",
        PATH,
        None,
        "The llama-server binary. Unset: `llama-server` on PATH, else the build installed by "
        "`scripts/install-llama-server`.",
        default_text="PATH lookup",
    ),
    KeySpec("max_models_per_gpu", INTEGER, 1, "How many models may be resident on one GPU at once.", 1),
    KeySpec(
        "eviction",
        STRING,
        "lru",
        "Which resident leaves a GPU when another model needs it: `lru` the one whose last request is "
        "oldest, `fifo` the earliest loaded. Pinned models never leave.",
        choices=("lru", "fifo"),
    ),
    *SCHEDULING_KEYS,
    KeySpec(
        "affinity_guard",
        INTEGER,
        1,
        "Prefix affinity: a model's free replica that recently served the longest part of a request's "
        "leading content (system prompt, tools, earlier turns) gets it, so llama-server can reuse its "
        "cached prompt, as long as it holds at most this many more requests than the least busy free "
        "replica. 0: only equally busy replicas compete.",
        0,
    ),
    KeySpec(
        "prefix_affinity",
        BOOLEAN,
        True,
        "Hash the leading content of chat, Anthropic messages, Responses and completion requests so that "
        "prefix affinity can choose their replica. false: every request goes to the least busy free replica.",
    ),
    KeySpec(
        "num_gpus",
        INTEGER,
        None,
        "Number of GPUs, overriding detection; GPU ids in the file must then be below it.",
        0,
        default_text="detected",
    ),
    KeySpec(
        "load_timeout",
        NUMBER,
        120.0,
        "Seconds a new replica has to answer /health with 200.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "hang_timeout",
        NUMBER,
        4.0,
        "Seconds a ready replica may leave its /health probes (every half second) unanswered — stopped, "
        "deadlocked in a driver call — before it is killed and replaced; its streams end with an error "
        "event, and the requests it had answered nothing go to the replacement. A busy replica still "
        "answers /health.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "reply_timeout",
        NUMBER,
        600.0,
        "Seconds a replica may send nothing while answering a request (time to the first byte included, "
        "so long prompts need room) before that exchange ends with an error.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "stop_timeout",
        NUMBER,
        10.0,
        "Seconds between SIGTERM and SIGKILL when a replica is stopped.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "shutdown_grace",
        NUMBER,
        30.0,
        "Seconds in-flight requests may still run after the router receives SIGTERM.",
        0,
    ),
    KeySpec("max_body_mib", INTEGER, 32, "Largest request body in MiB; larger bodies get 413.", 1),
    KeySpec(
        "keep_alive_timeout",
        NUMBER,
        75.0,
        "Seconds an idle client connection stays open after its last response (HTTP keep-alive); "
        "`Connection: close` and HTTP/1.0 connections close right after the response.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "max_connections",
        INTEGER,
        None,
        "Most client connections open at once; past it a new connection gets 503 at once. Unset: half of "
        "the open-file limit (raised towards its hard maximum, at most 65536, at start) less a reserve "
        "for replicas and files.",
        1,
        default_text="from the open-file limit",
    ),
    KeySpec(
        "send_timeout",
        NUMBER,
        60.0,
        "Seconds a client may leave its reply unread (nothing written reaches it) before its connection is "
        "closed and its request ended, freeing the slot.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "default_pool",
        STRING,
        None,
        "Pool (or pool alias) that serves requests naming no model or an unknown one.",
    ),
    KeySpec(
        "api_keys",
        STRING_LIST,
        (),
        "API keys clients must present. No keys at all (here, in the environment and in `api_keys_file`): "
        "no authentication. ROUTER_API_KEYS (comma-separated) replaces this list when set and non-empty.",
        env="ROUTER_API_KEYS",
        default_text="[]",
    ),
    KeySpec(
        "cors_origins",
        STRING_LIST,
        (),
        "Web origins (`scheme://host[:port]`) whose pages may call the router from a browser and read the "
        'replies; `"*"` allows every origin, `"null"` (sandboxed frames, `file://` pages) must be listed by '
        "itself. Any other foreign `Origin` gets 403. ROUTER_CORS_ORIGINS (comma-separated) replaces this "
        "list when set and non-empty. Follows reloads.",
        env="ROUTER_CORS_ORIGINS",
        default_text="[]",
        rule='a list of origins such as "http://localhost:3000", "*" or "null"',
    ),
    KeySpec(
        "allowed_hosts",
        STRING_LIST,
        (),
        "Host names the router answers to besides loopback ones (localhost, *.localhost, 127.0.0.0/8, "
        '[::1]) and its own `host`; a leading dot (`.example.lan`) also admits subdomains, `"*"` turns the '
        "check off. Bound to a loopback address the check always applies (it stops DNS rebinding); bound "
        "elsewhere only when this list is set. Other `Host` headers get 403. ROUTER_ALLOWED_HOSTS "
        "(comma-separated) replaces this list when set and non-empty. Follows reloads.",
        env="ROUTER_ALLOWED_HOSTS",
        default_text="[]",
        rule='a list of host names without port, such as "router.lan", ".example.lan" or "*"',
    ),
    KeySpec(
        "api_keys_file",
        PATH,
        None,
        "File with more keys, one per line; blank lines and lines starting with # are skipped. Read at "
        "startup, in addition to `api_keys`.",
    ),
    KeySpec(
        "history_db",
        PATH,
        None,
        "SQLite file of the request history. In the default, NAME-HASH is the config file's name without "
        "extension and 8 hex digits of the SHA-256 of its absolute path, so routers run on different files "
        "never share a database. A router started on a database another router is writing is refused "
        "(choose another with this key or HISTORY_DB_PATH). Changes with a restart.",
        env="HISTORY_DB_PATH",
        default_text="$XDG_STATE_HOME/llama-router/NAME-HASH/history.db (XDG_STATE_HOME unset: "
        "~/.local/state)",
    ),
    KeySpec("history_max_rows", INTEGER, 100000, "Most requests the history keeps; the oldest go first.", 1),
    KeySpec(
        "history_max_age_days",
        NUMBER,
        30.0,
        "Days a request stays in the history.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "gpu_reserve_mib",
        INTEGER,
        512,
        "MiB of every GPU that placement keeps free (driver and allocator overhead).",
        0,
    ),
    KeySpec(
        "allow_public_rpc",
        BOOLEAN,
        False,
        "Accept `[rpc_devices.NAME]` endpoints outside loopback and private address ranges. llama.cpp's RPC "
        "protocol has no authentication: whoever reaches an rpc-server can run tensors on it and read "
        "its memory. Leave false unless the path is protected otherwise (a VPN, an SSH tunnel).",
    ),
    KeySpec(
        "ctx_floor",
        INTEGER,
        2048,
        "Smallest total context the automatic context choice accepts; a model that does not fit with at "
        "least this much is refused.",
        1,
    ),
    KeySpec(
        "ctx_default",
        INTEGER,
        4096,
        "Total context of a model without `ctx` on a GPU whose memory cannot be read (no NVML, amdsmi or "
        "sysfs reading and no `[devices.N] memory_mib`): min(trained context, this).",
        1,
    ),
    KeySpec(
        "log_lines",
        INTEGER,
        400,
        "Lines of llama-server output kept in memory per replica (for error messages and `/logs/{replica}` "
        "when there is no log file).",
        1,
    ),
    KeySpec(
        "replica_logs",
        PATH,
        None,
        "Directory of the per-replica log files (`<model>-<replica>.log`, everything llama-server prints; "
        "served at `/logs/{replica}`). Changes with a restart.",
        default_text="$XDG_STATE_HOME/llama-router/logs (~/.local/state/llama-router/logs)",
    ),
    KeySpec(
        "replica_log_files",
        INTEGER,
        5,
        "Log files kept per model: when a replica starts, older files of its model beyond this many go.",
        1,
    ),
    KeySpec(
        "replica_log_max_mib",
        INTEGER,
        8,
        "Size in MiB at which a replica's log file is renamed to `<name>.log.1` (replacing the previous "
        "one) and started afresh.",
        1,
    ),
    KeySpec(
        "kv_store",
        BOOLEAN,
        True,
        "Keep prompt caches across swaps: before an idle replica is stopped (eviction, ttl, unload, reload, "
        "shutdown) the router asks it to save its slots' KV state to `kv_store_dir`, and a new replica of "
        "the same model file and cache flags gets the state that shares the longest prefix with the "
        "request that loads it. false: never save or restore (a model can opt out with its own `kv_store`).",
        env="ROUTER_KV_STORE",
    ),
    KeySpec(
        "kv_store_dir",
        PATH,
        None,
        "Directory of the saved KV states, one folder per model file and cache-affecting flags.",
        default_text="$XDG_STATE_HOME/llama-router/kv (~/.local/state/llama-router/kv)",
    ),
    KeySpec(
        "kv_store_mib",
        INTEGER,
        8192,
        "Most MiB of disk the saved KV states take; beyond it the least recently used states go first.",
        0,
    ),
    KeySpec(
        "kv_store_timeout",
        NUMBER,
        5.0,
        "Most seconds saving a replica's slots may delay its stop (and so a swap), and most seconds "
        "restoring a state may delay a new replica's first request. A save or restore that takes longer is "
        "abandoned: the model just starts cold.",
        0,
    ),
)

DEVICE_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "memory_mib",
        INTEGER,
        None,
        "Memory budget of this GPU in MiB, replacing the measured one (total memory minus what other "
        "processes hold). Needed where the GPU's memory cannot be read.",
        1,
        default_text="detected",
    ),
)

RPC_DEVICE_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "endpoint",
        STRING,
        None,
        "Where the rpc-server listens, `host:port` (an IPv6 address in brackets: `[fd00::5]:50052`). The "
        "host must be `localhost` or an IP address in a loopback, private or link-local range unless "
        "`router.allow_public_rpc` is true; host names other than `localhost` are refused (a name can "
        "resolve anywhere).",
        required=True,
        rule='"host:port" with a loopback, private or link-local IP address (or localhost) and a port '
        "between 1 and 65535",
    ),
    KeySpec(
        "memory_mib",
        INTEGER,
        None,
        "Memory of the remote device in MiB that placement may plan on (the router cannot read it); "
        "`router.gpu_reserve_mib` is kept free on it as on a local GPU.",
        1,
        required=True,
    ),
)

POOL_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "members",
        STRING_LIST,
        None,
        "Model names in priority order; no duplicates, aliases not accepted.",
        required=True,
    ),
    KeySpec(
        "fallback",
        BOOLEAN,
        False,
        "true: the members load at startup and stay pinned, and a request goes to the first member with "
        "a free slot. Needs at least two members.",
    ),
    KeySpec("aliases", STRING_LIST, (), "Other names clients may use for this pool.", default_text="[]"),
)

PEER_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "url",
        STRING,
        None,
        "Base URL of another llama-router (or any OpenAI-compatible server), `http://host:port` or "
        "`https://host[:port][/prefix]`; requests go to `URL/v1/...`.",
        required=True,
    ),
    KeySpec(
        "api_key",
        STRING,
        None,
        "The key sent to the peer (`Authorization: Bearer KEY`). Unset: none, unless `api_key_file` is set.",
    ),
    KeySpec(
        "api_key_file",
        PATH,
        None,
        "A file whose first non-empty line is the key sent to the peer (instead of `api_key`, which must "
        "then be unset); read at start and on every reload.",
    ),
    KeySpec(
        "models",
        STRING_LIST,
        (),
        "The peer's models served here. Empty: discovered from the peer's /v1/models (its own models, not "
        "those it serves from peers of its own), again every `refresh` seconds and on reload.",
        default_text="[] (discover)",
    ),
    KeySpec(
        "max_in_flight",
        INTEGER,
        None,
        "Most requests forwarded to the peer at once; more wait here, in the router's queue. Unset: the "
        "capacity the peer advertises (a llama-router's slots over its models), else 4.",
        1,
        default_text="advertised, else 4",
    ),
    KeySpec(
        "refresh",
        NUMBER,
        30.0,
        "Seconds between two reads of the peer's /v1/models, which also tell whether it is up.",
        1,
    ),
    KeySpec(
        "connect_timeout",
        NUMBER,
        5.0,
        "Seconds to connect to the peer; past it, the peer counts as down (a pool tries its next member).",
        0,
        exclusive_minimum=True,
    ),
)
