"""What a model can do, as a list of words a client can match: ``chat``, ``completion``, ``embedding``,
``rerank``, ``vision`` and ``tools``, always in that order.

They are read from the llama-server flags the model's replicas start with (``[defaults]``, then its own
table), whatever their spelling (``mm`` and ``mmproj``, ``embeddings`` and ``embedding``):

- ``embedding``/``embeddings``: an embedding model (``embedding``), which answers no chat or completion;
  with ``pooling = "rank"`` it is a reranker;
- ``reranking``/``rerank``: a reranker (``rerank``), which answers no chat or completion either;
- otherwise it generates text: ``chat`` and ``completion``, and ``tools`` unless ``no-jinja`` is set
  (llama-server renders chats with the model's Jinja template by default, which is what its tool calls
  need);
- ``mmproj``/``mmproj-url`` (and no ``no-mmproj``): a multimodal projector, ``vision``.

A pool can do what any of its members can (the union, in the same order); a name that is neither a model
nor a pool of the configuration (a peer's model) can do nothing that the configuration knows of: ``[]``.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.config.llama_args import flag_identity, merged_flags
from router.config.values import Config, FlagValue

__all__ = ["CAPABILITIES", "capabilities", "model_capabilities"]

CAPABILITIES = ("chat", "completion", "embedding", "rerank", "vision", "tools")


def _flags(pairs: Iterable[tuple[str, FlagValue]]) -> dict[str, FlagValue]:
    """The last value of each flag by its identity; a flag set to ``false`` is left out (it is not passed)."""
    found: dict[str, FlagValue] = {}
    for key, value in pairs:
        identity = flag_identity(key)
        if value is False:
            found.pop(identity, None)
        else:
            found[identity] = value
    return found


def model_capabilities(config: Config, model: str) -> set[str]:
    """The capabilities of the model ``model`` of ``config`` (a set; ``capabilities`` orders it)."""
    spec = config.models[model]
    flags = _flags(merged_flags(config.defaults, spec.extra_args))
    rank_pooling = str(flags.get("pooling", "")).strip().lower() == "rank"
    found: set[str] = set()
    if "reranking" in flags or "rerank" in flags:
        found.add("rerank")
    elif "embedding" in flags or "embeddings" in flags:
        found.add("rerank" if rank_pooling else "embedding")
    else:
        found |= {"chat", "completion"}
        if "no-jinja" not in flags:
            found.add("tools")
    if ("mmproj" in flags or "mmproj-url" in flags) and "no-mmproj" not in flags:
        found.add("vision")
    return found


def capabilities(config: Config, name: str) -> list[str]:
    """What the model or pool ``name`` of ``config`` can do, in the order of ``CAPABILITIES``; a pool can
    do what any of its members can. ``[]`` for a name the configuration does not define."""
    if name in config.models:
        found = model_capabilities(config, name)
    elif name in config.pools:
        found = set()
        for member in config.pools[name].members:
            if member in config.models:
                found |= model_capabilities(config, member)
    else:
        return []
    return [word for word in CAPABILITIES if word in found]
