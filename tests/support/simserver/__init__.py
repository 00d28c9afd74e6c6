"""A simulated llama-server: a real HTTP server process that speaks the parts of llama.cpp's server API the
router uses, with behaviour (load time, token rate, crashes, out-of-memory at load, ...) read from the model
file, which for the simulator is a small JSON document (see ``Behaviour``).

Run it as ``python -m tests.support.simserver --host 127.0.0.1 --port N -m MODEL.json -c CTX -np SLOTS ...``
from the repository root, or through the launcher ``tests.support.simtools.sim_launcher`` writes. Unknown
flags (``--flag value``, ``--flag=value`` or a bare ``--flag``) are accepted and ignored. ``--help`` (``-h``,
``--usage``) prints the flags llama-server b11434 accepts (``tests/support/llama-server-help.txt``) and
exits, so the router's check of pass-through flags sees the flags a real llama-server accepts; ``--version``
prints b11434's version line (``version: sim (build 11434, commit b0-sim)``) and exits.

Tokenisation rule, used everywhere (prompts, /tokenize, the prompt cache, context checks): one token per
whitespace-separated word (``str.split()``); a token's id is the CRC-32 of the word's UTF-8 bytes. Generated
token ``i`` of a reply has the text ``" tok{i}"`` (or the next word of the ``reply`` text), which is one
token under the same rule.

Errors follow llama-server b11434 where the router depends on them: JSON error bodies in its shape; an
empty 400 for a multipart body (cpp-httplib); 500s for some bodies that are the client's mistake (Anthropic
messages without ``messages``, ``tools`` that are not an array, a chat message without ``role``); and, with
``web_ui``, a page at ``/`` that answers 415 in plain text to a client that does not accept gzip.

The modules: ``behaviour`` (the model file's keys), ``args`` (the flags read), ``tokens`` (tokens,
templates, embeddings), ``slots`` (slots, queue, counters and server state), ``generation`` (jobs and
generations), ``shapes`` (the OpenAI, llama.cpp, Anthropic and Responses replies), ``http_base``,
``info_routes`` and ``handler`` (the HTTP server and its endpoints), ``main`` (start-up, loading, shutdown)
and ``log``. Only the standard library is imported so that the process listens within a few tens of
milliseconds.
"""

from tests.support.simserver.behaviour import BEHAVIOUR_KEYS, SIDECAR_SUFFIX, Behaviour
from tests.support.simserver.main import main

__all__ = ["BEHAVIOUR_KEYS", "SIDECAR_SUFFIX", "Behaviour", "main"]
