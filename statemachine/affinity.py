"""Prefix affinity: how much of a request's prefix chain a replica recently served, and what it remembers.

A chain is a tuple of block hashes where element i stands for the request's first i+1 blocks of leading
content, so the number of leading elements two chains share is the number of leading blocks their prompts
share. A replica's memory is the chains of the last requests dispatched to it, most recent first.
"""

from __future__ import annotations

Chain = tuple[int, ...]


def shared(memory: tuple[Chain, ...], chain: Chain) -> int:
    """The longest run of leading elements that ``chain`` shares with one of the remembered chains."""
    best = 0
    for known in memory:
        n = min(len(known), len(chain))
        if n <= best:
            continue
        if known[:n] == chain[:n]:
            best = n
            continue
        k = 0
        while known[k] == chain[k]:
            k += 1
        best = max(best, k)
    return best


def remember(memory: tuple[Chain, ...], chain: Chain, bound: int) -> tuple[Chain, ...]:
    """``memory`` after a dispatch of ``chain``: it goes in front, the chains it extends (or repeats) are
    dropped, and only the ``bound`` most recent stay. An empty chain leaves the memory as it is."""
    if not chain:
        return memory
    kept = (known for known in memory if not (len(known) <= len(chain) and chain[: len(known)] == known))
    return (chain, *kept)[: max(bound, 0)]
