"""Prefix chains of request bodies: stable across the turns of one conversation, apart for different ones."""

from __future__ import annotations

from typing import Any

from router.http.prefix_key import BLOCK, MAX_BLOCKS, chain_of, leading_content, prefix_chain, request_chain
from statemachine import ModelSpec, PoolSpec, Settings

SYSTEM = "You are a careful assistant. " * 80  # about 2.3 KiB
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def turns(opening: str, count: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for n in range(count):
        messages.append({"role": "user", "content": f"{opening} question {n}: " + "details " * 150})
        messages.append({"role": "assistant", "content": f"answer {n}: " + "words " * 120})
    return messages


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "tools": TOOLS, **extra}


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def test_a_later_turn_extends_the_earlier_chain() -> None:
    first = prefix_chain(chat(turns("trip", 1)), "/v1/chat/completions")
    later = prefix_chain(chat(turns("trip", 3)), "/v1/chat/completions")
    assert len(first) >= 3 and len(later) > len(first)
    assert later[: len(first)] == first
    data = leading_content(chat(turns("trip", 1)), "/v1/chat/completions")
    assert data is not None and len(first) == len(data) // BLOCK  # full blocks only


def test_different_conversations_diverge_after_what_they_share() -> None:
    a = prefix_chain(chat(turns("trip", 2)), "/v1/chat/completions")
    b = prefix_chain(chat(turns("tax", 2)), "/v1/chat/completions")
    common = shared(a, b)
    assert 1 <= common < min(len(a), len(b))  # the tools and system prompt, then apart
    other = prefix_chain({"messages": turns("trip", 2)}, "/v1/chat/completions")  # no tools
    assert shared(a, other) == 0


def test_per_request_fields_do_not_matter() -> None:
    plain = prefix_chain(chat(turns("trip", 2)), "/v1/chat/completions")
    tuned = chat(turns("trip", 2), model="other", stream=True, max_tokens=9, temperature=0.1, seed=4)
    assert prefix_chain(tuned, "/v1/chat/completions") == plain
    reordered = dict(reversed(list(chat(turns("trip", 2)).items())))
    assert prefix_chain(reordered, "/v1/chat/completions") == plain


def test_anthropic_responses_and_completions_shapes() -> None:
    messages = turns("trip", 2)[1:]
    anthropic_1 = prefix_chain({"system": SYSTEM, "messages": messages[:2]}, "/v1/messages")
    anthropic_2 = prefix_chain({"system": SYSTEM, "messages": messages}, "/v1/messages")
    assert anthropic_1 and anthropic_2[: len(anthropic_1)] == anthropic_1
    assert prefix_chain({"messages": messages}, "/v1/messages")[:1] != anthropic_1[:1]  # system counts
    responses_1 = prefix_chain({"instructions": SYSTEM, "input": messages[:2]}, "/v1/responses")
    responses_2 = prefix_chain({"instructions": SYSTEM, "input": messages}, "/responses")
    assert responses_1 and responses_2[: len(responses_1)] == responses_1
    assert len(prefix_chain({"input": "x" * 5000}, "/v1/responses")) == 4
    prompt = "Once upon a time " * 200
    short = prefix_chain({"prompt": prompt}, "/completion")
    longer = prefix_chain({"prompt": prompt + "more " * 300}, "/v1/completions")
    assert short and longer[: len(short)] == short


def test_unknown_shapes_and_short_content_give_no_chain() -> None:
    long = turns("trip", 2)
    assert prefix_chain({"messages": "hi"}, "/v1/chat/completions") == ()
    assert prefix_chain({"input": 3}, "/v1/responses") == ()
    assert prefix_chain({"prompt": [1, 2, 3]}, "/completion") == ()
    assert prefix_chain({"messages": long}, "/v1/embeddings") == ()
    assert prefix_chain({"messages": long}, "/tokenize") == ()
    assert prefix_chain({"messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions") == ()


def test_the_chain_is_capped_and_chained() -> None:
    data = bytes(range(256)) * (BLOCK * (MAX_BLOCKS + 10) // 256)
    chain = chain_of(data)
    assert len(chain) == MAX_BLOCKS
    same_blocks = chain_of(data[BLOCK : 3 * BLOCK])  # the same bytes at another position hash differently
    assert same_blocks[0] != chain[1]
    assert all(0 <= h < 2**64 for h in chain)


def test_the_scheduler_gets_a_chain_only_where_a_replica_is_to_be_chosen() -> None:
    settings = Settings(
        models=[ModelSpec("one"), ModelSpec("two", replicas=2), ModelSpec("other")],
        pools=[PoolSpec("ordered", ("one", "two")), PoolSpec("spread", ("one", "two"), fallback=True)],
    )
    body = chat(turns("a", 2))
    path = "/v1/chat/completions"
    whole = prefix_chain(body, path)
    assert whole
    assert request_chain(settings, True, "two", body, path) == whole
    assert request_chain(settings, True, "spread", body, path) == whole  # a member with two replicas
    assert request_chain(settings, True, "one", body, path) == ()  # one replica: nothing to choose
    assert request_chain(settings, True, "ordered", body, path) == ()  # only its first member serves
    assert request_chain(settings, False, "two", body, path) == ()  # prefix_affinity = false
