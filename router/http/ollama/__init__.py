"""Ollama's API on the router's port: ``/api/chat``, ``/api/generate``, ``/api/embed`` and
``/api/embeddings`` become OpenAI-shaped requests to llama-server and go through the same admission,
queueing, keys, classes and pools as every other route (``router.http.forward``); their answers come back in
Ollama's shapes, streams as NDJSON. ``/api/tags``, ``/api/ps``, ``/api/show`` and ``/api/version`` describe
the models served here. Every request field and what it becomes is listed in docs/ollama.md.
"""
