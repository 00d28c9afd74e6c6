"""No-spill placement: what a model needs on each device, read from its GGUF header alone.

``gguf_header`` reads headers (metadata and tensor infos, skipping the tokenizer), ``footprint`` turns a
header into per-device bytes (weights, KV cache, recurrent state, compute buffer, reserve), ``budgets``
finds what each device has, ``fit`` decides per model (fits with a context, refused, override, unknown
budget, error), ``plan`` renders every decision as a versioned document and a table, and ``synthetic``
writes header-only files for tests. Nothing is imported here, so reading a header stays cheap.
"""
