"""No-spill placement: what a model needs on each device, read from its GGUF header alone.

``gguf_header`` reads headers (metadata and tensor infos, skipping the tokenizer), ``geometry`` turns a
header into per-layer facts (weights, KV heads, sliding windows, recurrent state), ``kv_layout`` lays a
context out over the slots and prices a KV cell, ``footprint`` adds it all up per device (weights, KV
cache, recurrent state, compute buffer, reserve), ``budgets`` finds what each device has, ``fit`` decides
per model (fits with a context, refused, override, unknown budget, error), ``prompt_cache`` sizes each
replica's host-memory prompt cache and sums host memory over all models, ``plan`` renders every decision
as a versioned document and a table, and ``synthetic`` writes header-only files for tests. Nothing is
imported here, so reading a header stays cheap.
"""
