"""The key records of a model's table (``[models.NAME]``; ``[defaults]`` may set some of them for every
model).

Part of the configuration schema (``router.config.schema`` holds the other tables): one
:class:`~router.config.keyspec.KeySpec` per key, validated by ``router.config.tables`` and rendered into the
configuration reference by ``router.config.reference``. What a model's table holds besides these keys is
llama-server flags (``router.config.llama_args``).
"""

from __future__ import annotations

from router.config.keyspec import BOOLEAN, INTEGER, NUMBER, PATH, STRING_LIST, KeySpec

# Model keys that [defaults] may also set; a model's own value wins.
DEFAULTABLE_MODEL_KEYS: tuple[str, ...] = (
    "cram",
    "kv_store",
    "gpus",
    "gpus_max",
    "spread",
    "env",
    "set_params",
    "strip_params",
)

GPUS_TYPE = 'list of GPU ids, "all", "any" or -1'
PRICING_TYPE = "table of numbers"
EFFORT_TYPE = "table"
ENV_TYPE = "table of strings"
PARAMS_TYPE = "table"

MODEL_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "model",
        PATH,
        None,
        "Path of the GGUF file (relative paths start at the config file's directory).",
        required=True,
    ),
    KeySpec(
        "gpus",
        GPUS_TYPE,
        (0,),
        'GPUs a replica spans; "all" (or -1) means every GPU the router sees. A single id may be given '
        'without brackets. "any": the scheduler chooses at each load, one card whenever the model fits '
        "one, else the fewest that hold it (see Placement by the scheduler). `[]` runs the model on the "
        "CPU against host memory (`-ngl 0`); with `num_gpus = 0`, or unset on a host with no GPU at all "
        "(none read, declared or listed by `llama-server --list-devices`), that is the default. Also "
        "settable in `[defaults]`.",
        rule='"all", "any", -1, a GPU id, [] (CPU only), or a list of distinct GPU ids >= 0 (below '
        "`num_gpus` when set)",
    ),
    KeySpec(
        "gpus_max",
        INTEGER,
        None,
        'With `gpus = "any"`: the most GPUs one replica may be split over. Also settable in `[defaults]`.',
        1,
        default_text="every GPU",
    ),
    KeySpec(
        "spread",
        BOOLEAN,
        True,
        'With `gpus = "any"` and `num_instance` > 1: each replica prefers a card that holds none of the '
        "model yet. Also settable in `[defaults]`.",
    ),
    KeySpec(
        "rpc",
        STRING_LIST,
        (),
        "Names of `[rpc_devices.NAME]` a replica spans besides its `gpus` (with `gpus = []`: only "
        "them); the layers are split over the RPC devices and the GPUs by their budgets. An rpc-server "
        "serves one client at a time, so a model with `rpc` has one replica (`num_instance = 1`).",
        default_text="[]",
        rule="a list of distinct names of [rpc_devices.NAME] tables",
    ),
    KeySpec("num_instance", INTEGER, 1, "Replicas of this model that may run at once.", 1),
    KeySpec("parallel", INTEGER, 1, "Slots per replica (llama-server `-np`).", 1),
    KeySpec(
        "ctx",
        INTEGER,
        None,
        "Total context of a replica (llama-server `-c`); each slot gets ctx/parallel tokens. Unset: the "
        "largest context that fits, at least `ctx_floor`, at most the model's trained context.",
        1,
        rule="an integer >= 1 and >= `parallel`",
        default_text="auto",
    ),
    KeySpec(
        "gpu_layers",
        INTEGER,
        None,
        "Layers offloaded to the GPUs (llama-server `-ngl`), overriding placement's choice of all layers.",
        0,
        default_text="all layers",
    ),
    KeySpec(
        "cram",
        INTEGER,
        None,
        "MiB of host memory each replica may keep for the prompt states of recent conversations "
        "(llama-server `--cache-ram`); 0 turns that cache off. Also settable in `[defaults]`. Unset: room "
        "for two full slot contexts of this model, between 256 and 8192 MiB, never more than the host can "
        "spare (see Prompt caching).",
        0,
        default_text="auto",
    ),
    KeySpec("aliases", STRING_LIST, (), "Other names clients may use for this model.", default_text="[]"),
    KeySpec("pinned", BOOLEAN, False, "A pinned model is never evicted."),
    KeySpec(
        "ttl",
        NUMBER,
        None,
        "Seconds after its last request ends before an idle replica is stopped. Not allowed with pinned.",
        0,
        exclusive_minimum=True,
        default_text="never",
    ),
    KeySpec("load_on_startup", BOOLEAN, False, "Start a replica when the router starts."),
    KeySpec(
        "kv_store",
        BOOLEAN,
        True,
        "Save this model's slots before its replicas stop and restore them when it returns (see the "
        "router's `kv_store`, which turns it off for every model). Also settable in `[defaults]`.",
    ),
    KeySpec(
        "pricing",
        PRICING_TYPE,
        None,
        "Prices in dollars per million tokens, shown in /v1/models.",
        rule="a table with at least one of `input`, `cached_input`, `output`, each a number >= 0",
    ),
    KeySpec(
        "reasoning_effort",
        EFFORT_TYPE,
        None,
        "Reasoning effort levels the model offers, shown in /v1/models.",
        rule="a table: `options`, a non-empty list of distinct strings, and optionally `default`, one "
        "of them, and `disable`, the level that turns reasoning off",
    ),
    KeySpec(
        "llama_server",
        PATH,
        None,
        "The llama-server binary this model's replicas run instead of `router.llama_server` (another "
        "build: Vulkan, ROCm, a newer release). Checked at startup and on every reload like that one: it "
        "must be an executable file (a bare name is looked up on PATH) whose `--help` lists llama-server's "
        "flags, and the model's flags (and those of `[defaults]`) are checked against that list. A Vulkan or "
        "SYCL build is masked by its own `--list-devices`. The router's own binary is still looked up.",
        default_text="router.llama_server",
        rule="a non-empty path string naming an executable llama-server",
    ),
    KeySpec(
        "env",
        ENV_TYPE,
        None,
        'Environment variables added to this model\'s replicas (`{ GGML_VK_PREFER_HOST_MEMORY = "1" }`); '
        "an integer value is written as its digits. The GPU masks the router sets itself "
        "(`CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`, `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`, "
        "`GPU_DEVICE_ORDINAL`, `GGML_VK_VISIBLE_DEVICES`, `ONEAPI_DEVICE_SELECTOR`: use `gpus`) and the "
        "variables llama-server reads as flags (`LLAMA_ARG_*`, `LLAMA_API_KEY`: write the flag as a key) "
        "are refused. Replicas restart when it changes on reload. Also settable in `[defaults]` (a model's "
        "own table replaces it whole).",
        default_text="{}",
        rule="a table of variable names (letters, digits, _) to strings or integers",
    ),
    KeySpec(
        "set_params",
        PARAMS_TYPE,
        None,
        "Request body fields forced on every request this model serves, over what the client sent "
        "(`{ temperature = 0.2, top_k = 40 }`), on every endpoint relayed to its replicas (a pool's "
        "request gets those of the member that serves it; a request relayed to a peer router gets that "
        "router's filters). Bodies that are not a JSON object pass unchanged. Shown on /props. Also "
        "settable in `[defaults]` (a model's own table replaces it whole).",
        default_text="{}",
        rule="a table of field names (not `model`, `stream`, `messages`, `prompt`, `input`) to JSON values",
    ),
    KeySpec(
        "strip_params",
        STRING_LIST,
        None,
        "Request body fields removed from every request this model serves, like `set_params`. A field is "
        "set or stripped, not both. A model with neither key gets the client's body byte for byte. Also "
        "settable in `[defaults]`.",
        default_text="[]",
        rule="a list of distinct field names (not `model`, `stream`, `messages`, `prompt`, `input`)",
    ),
)

PRICING_KEYS: tuple[str, ...] = ("input", "cached_input", "output")
EFFORT_KEYS: tuple[str, ...] = ("options", "default", "disable")
