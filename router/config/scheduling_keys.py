"""The ``[router]`` keys of the scheduler's order: swaps, the queue's bounds, the classes' maximum waits.

Part of ``ROUTER_KEYS`` (router.config.schema), in this order.
"""

from __future__ import annotations

from router.config.keyspec import INTEGER, NUMBER, STRING_LIST, KeySpec

SCHEDULING_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "preload",
        STRING_LIST,
        (),
        "Models (or aliases) to load when the router starts, in this order, as `POST /models/load` does: "
        "unlike `pinned` they may be evicted like any other model. A model that does not fit beside the "
        "earlier ones replaces them once they are loaded.",
        default_text="[]",
    ),
    KeySpec(
        "ttl",
        NUMBER,
        None,
        "Seconds an idle model stays loaded, for every model that sets no `ttl` of its own (pinned models "
        "and fallback pool members stay). A request's `keep_alive` replaces it for its model.",
        0,
        exclusive_minimum=True,
        default_text="never",
    ),
    KeySpec(
        "max_keep_alive",
        NUMBER,
        None,
        "The longest `keep_alive` a request may ask for, in seconds; a longer one (or -1, keep for ever) "
        "is cut to this.",
        0,
        default_text="no bound",
    ),
    KeySpec(
        "swap_batch_max",
        INTEGER,
        4,
        "Fewer swaps: while a request waits for its model to be swapped in, at most this many later requests "
        "for the models already loaded on those GPUs are served first; then it holds the GPUs and its swap "
        "happens once their work in flight is done.",
        1,
    ),
    KeySpec(
        "swap_batch_window",
        NUMBER,
        30.0,
        "Seconds a request waiting for a swap lets later requests for loaded models go first, whatever "
        "`swap_batch_max` allows (an `interactive` request lets none go first).",
        0,
    ),
    KeySpec(
        "swap_hold",
        NUMBER,
        None,
        "Seconds a loaded model that has just finished a request is kept for its client to come back, while "
        "a request waiting for a swap does not hold the GPUs yet. Unset: a tenth of the load times measured "
        "for the two models. 0: no hold.",
        0,
        default_text="a tenth of the swap",
    ),
    KeySpec(
        "min_residency",
        NUMBER,
        0.0,
        "Seconds a model stays loaded after it became ready before another model may evict it, unless a "
        "request has waited its class's maximum wait (`max_wait_*`).",
        0,
    ),
    KeySpec(
        "queue_head_grace",
        NUMBER,
        None,
        "Timed order instead of swap batching: a request whose model is not loaded lets later requests for "
        "loaded models go first for this many seconds, without a count bound or a hold; after that it holds "
        "the queue. 0: strict arrival order. Not allowed with `swap_batch_max`, `swap_batch_window` or "
        "`swap_hold`.",
        0,
        default_text="unset (swap batching)",
    ),
    KeySpec(
        "queue_force_load_timeout",
        NUMBER,
        300.0,
        "Last resort against starvation: a queued request that has waited this long holds its GPUs and "
        "gets its swap, whatever the swap batching or `queue_head_grace` says (both are capped by it).",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "queue_limit",
        INTEGER,
        1000,
        "Most requests waiting in the router as a whole; further requests are rejected. 0 rejects whatever "
        "cannot be dispatched at once.",
        0,
    ),
    KeySpec(
        "routing_queue_limit",
        INTEGER,
        32,
        "Most requests waiting for one pool; further ones are rejected.",
        0,
    ),
    KeySpec(
        "max_wait_interactive",
        NUMBER,
        30.0,
        "Seconds a waiting request of class `interactive` (see `[keys.NAME]`) is ordered by class and fair "
        "share; after that it goes before every class, oldest first.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "max_wait_standard",
        NUMBER,
        120.0,
        "Seconds a waiting request of class `standard` (the default) may let requests of a higher class "
        "go first; after that it goes before every class, oldest first.",
        0,
        exclusive_minimum=True,
    ),
    KeySpec(
        "max_wait_batch",
        NUMBER,
        600.0,
        "Seconds a waiting request of class `batch` may let requests of higher classes go first; after "
        "that it goes before every class, oldest first, so batch work never starves.",
        0,
        exclusive_minimum=True,
    ),
)
