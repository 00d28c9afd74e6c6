"""Picking the lines that explain a failed llama-server: the cause first, then the last failure lines.

The outputs below are what llama-server b11434 printed (paths shortened), with its default log prefix
(timestamp and level) and, where noted, as older builds or ``--no-log-prefix`` print them.
"""

from __future__ import annotations

from router.shell.logring import quote_lines, telling_lines

START = [
    "0.00.002.314 I srv  llama_server: initializing ...",
    "0.00.002.319 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` "
    "CLI arg)",
    "0.00.002.434 W srv  llama_server: security: no API key is set and CORS allows all origins (see "
    "https://github.com/ggml-org/llama.cpp/pull/25655)",
    "0.00.004.591 I srv    load_model: loading model '/m/tiny.gguf'",
]

# -ctk q8_0 on a model with 16-wide heads (flash attention left on auto)
K_CACHE = [
    *START,
    "0.00.060.765 E llama_init_from_model: K cache type q8_0 with block size 32 does not divide "
    "n_embd_head_k=16",
    "0.00.060.827 E cmn  common_init_: failed to create context with model '/m/tiny.gguf'",
    "0.00.060.838 E cmn  common_init_: failed to create context with model '/m/tiny.gguf'",
    "0.00.060.846 E srv    load_model: failed to create_context with model '/m/tiny.gguf'",
    "0.00.060.855 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.061.274 E srv  llama_server: exiting due to model loading error",
]

# a model file cut short
TRUNCATED = [
    *START,
    "0.00.008.687 E gguf_init_from_reader: failed to read key-value pairs",
    "0.00.009.036 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
    "/m/tiny.gguf",
    "0.00.009.073 E llama_model_load_from_file_impl: failed to load model",
    "0.00.009.075 E cmn  common_init_: failed to load model '/m/tiny.gguf'",
    "0.00.009.076 E srv    load_model: failed to load model, '/m/tiny.gguf'",
    "0.00.009.078 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.009.541 E srv  llama_server: exiting due to model loading error",
]


def test_the_cause_leads_without_prefixes_or_repeats() -> None:
    assert telling_lines(K_CACHE) == [
        "llama_init_from_model: K cache type q8_0 with block size 32 does not divide n_embd_head_k=16",
        "cmn common_init_: failed to create context with model '/m/tiny.gguf'",
        "srv load_model: failed to create_context with model '/m/tiny.gguf'",
        "srv llama_server: exiting due to model loading error",
    ]
    assert quote_lines(K_CACHE).startswith(
        "llama_init_from_model: K cache type q8_0 with block size 32 does not divide n_embd_head_k=16 | "
    )


def test_the_cause_is_kept_when_the_generic_lines_fill_the_quota() -> None:
    assert telling_lines(TRUNCATED, most=3) == [
        "gguf_init_from_reader: failed to read key-value pairs",
        "srv load_model: failed to load model, '/m/tiny.gguf'",
        "srv llama_server: exiting due to model loading error",
    ]
    assert telling_lines(K_CACHE, most=2) == [
        "llama_init_from_model: K cache type q8_0 with block size 32 does not divide n_embd_head_k=16",
        "srv llama_server: exiting due to model loading error",
    ]


def test_without_a_log_prefix_the_cause_is_recognised_by_its_words() -> None:
    bare = [line.split(" ", 2)[2] for line in K_CACHE]  # "--no-log-prefix": no timestamp, no level
    picked = telling_lines(bare, most=3)
    assert picked == [
        "llama_init_from_model: K cache type q8_0 with block size 32 does not divide n_embd_head_k=16",
        "srv load_model: failed to create_context with model '/m/tiny.gguf'",
        "srv llama_server: exiting due to model loading error",
    ]
    quantized_v = [
        "llama_init_from_model: quantized V cache requires flash_attn to be enabled",
        "common_init_from_params: failed to create context with model '/m/tiny.gguf'",
    ]
    assert telling_lines(["load_tensors: loading model tensors", *quantized_v]) == quantized_v
    assert telling_lines(["error: invalid argument: --no-such-flag"]) == [
        "error: invalid argument: --no-such-flag"
    ]


def test_warnings_and_fallbacks_are_never_the_cause() -> None:
    lines = [
        "warning: failed to mlock 1048576-byte buffer (after previously locking 0 bytes): Cannot allocate "
        "memory",
        "Failed to open file '/m/tiny.gguf' with error: Invalid argument. Falling back to buffered I/O",
        "llama_init_from_model: K cache type q8_0 with block size 32 does not divide n_embd_head_k=16",
        "common_init_from_params: failed to create context with model '/m/tiny.gguf'",
        "main: exiting due to model loading error",
    ]
    assert telling_lines(lines, most=3) == lines[2:]
    # the cause leads even where a warning came before it
    assert telling_lines(lines) == [lines[2], lines[0], lines[1], lines[3], lines[4]]
    # prefixed warnings are not failures at all, whatever they say
    warned = [
        "0.00.002.685 W DEPRECATED: argument '-c' specified multiple times (only last value will be used)",
        "0.00.002.700 W llama_mmap: failed to open file, error: falling back to buffered I/O",
        *K_CACHE[4:],
    ]
    assert telling_lines(warned)[0].startswith("llama_init_from_model: K cache type q8_0")


def test_out_of_memory_is_the_cause_before_other_failures() -> None:
    lines = [
        *START,
        "0.00.201.100 E llama_model_load: error loading model architecture: unknown model architecture: 'x'",
        "0.01.302.004 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "0.01.302.010 E alloc_tensor_range: failed to allocate CUDA0 buffer of size 9663676416",
        "0.01.302.400 E llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        "0.01.302.410 E llama_model_load_from_file_impl: failed to load model",
        "0.01.302.420 E srv  llama_server: exiting due to model loading error",
    ]
    picked = telling_lines(lines, most=3)
    assert picked[0].startswith("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB")
    assert picked[1:] == [
        "alloc_tensor_range: failed to allocate CUDA0 buffer of size 9663676416",
        "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
    ]


def test_without_failure_lines_the_last_ones_are_quoted() -> None:
    slow = [
        *START,
        "0.00.064.594 I cmn          init: llama threadpool init, n_threads = 1",
        "0.00.068.073 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 2048, "
        "kv_unified = 'false'",
        "",
        "0.00.070.694 I srv  llama_server: model loaded",
    ]
    assert telling_lines(slow, tail=2) == [
        "srv load_model: initializing, n_slots = 1, n_ctx_slot = 2048, kv_unified = 'false'",
        "srv llama_server: model loaded",
    ]
    assert quote_lines([]) == "(no output)"
    long = "llama_init_from_model: " + "x" * 400 + " does not divide"
    assert quote_lines([long], width=40) == long[:37] + "..."


def test_a_replica_that_served_gets_its_latest_lines_not_an_old_error() -> None:
    lines = [
        "0.00.070.694 I srv  llama_server: model loaded",
        "0.12.004.120 E srv    send_error: task id = 7, error: the request exceeds the available context",
        "0.12.004.200 I srv  log_server_r: done request: POST /v1/chat/completions 127.0.0.1 400",
        "/src/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:93: CUDA error",
        "CUDA error: an illegal memory access was encountered",
        "  current device: 0, in function ggml_backend_cuda_synchronize at ggml-cuda.cu:2711",
    ]
    crash = ["/src/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:93: CUDA error", lines[4]]
    assert telling_lines(lines, most=2, cause=False) == crash
    assert quote_lines(lines, most=2, cause=False) == " | ".join(crash)
    # while loading, the first error would lead
    assert telling_lines(lines, most=2)[0].startswith("srv send_error: task id = 7")
