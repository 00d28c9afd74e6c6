"""The sliding windows of a key's requests_per_minute and tokens_per_day (router.shell.quota), on a given
clock."""

from __future__ import annotations

from router.config.values import KeyConfig
from router.shell.quota import Quotas, duration_text


def quotas(**limits: int) -> Quotas:
    return Quotas({"a": KeyConfig("a", "s", **limits), "free": KeyConfig("free", "t")})  # type: ignore[arg-type]


def test_requests_per_minute_is_a_sliding_window_of_admissions() -> None:
    q = quotas(requests_per_minute=2)
    assert q.refusal("a", 100.0) is None and q.refusal("a", 130.0) is None
    over = q.refusal("a", 150.0)
    assert over is not None
    assert over.headers["Retry-After"] == "10"  # the request of 100.0 leaves the minute at 160.0
    assert over.headers["x-ratelimit-reset-requests"] == "10s"
    assert over.headers["x-ratelimit-remaining-requests"] == "0"
    assert q.refusal("a", 160.5) is None  # a refused request did not count
    assert q.refusal("a", 161.0) is not None
    assert q.refusal("free", 161.0) is None and q.refusal("", 161.0) is None


def test_tokens_per_day_counts_what_replies_used_until_they_leave_the_day() -> None:
    q = quotas(tokens_per_day=100)
    q.spent("a", 1000.0, 60)
    assert q.refusal("a", 1001.0) is None  # 60 of 100: still room, whatever the next reply costs
    q.spent("a", 2000.0, 50)
    over = q.refusal("a", 2001.0)
    assert over is not None and "tokens_per_day = 100 (110 in the last 24 h)" in over.message
    assert over.headers["x-ratelimit-remaining-tokens"] == "0"
    assert int(over.headers["Retry-After"]) == 1000 + 86400 - 2001  # the 60 leave: 50 < 100
    assert q.refusal("a", 1000.0 + 86400.0) is None


def test_a_reload_keeps_what_a_kept_key_used_and_forgets_removed_ones() -> None:
    q = quotas(requests_per_minute=1)
    assert q.refusal("a", 0.0) is None
    q.configure({"a": KeyConfig("a", "s", requests_per_minute=1)})
    assert q.refusal("a", 1.0) is not None
    q.configure({})
    assert q.refusal("a", 2.0) is None


def test_the_day_is_refilled_from_history_rows_but_not_with_older_ones() -> None:
    q = quotas(tokens_per_day=100)
    q.seed([("a", 10.0, 500), ("a", 90_000.0, 100), ("free", 90_000.0, 10**6)], now=90_001.0)
    assert q.use["a"].token_sum == 100  # the row of 10.0 is more than a day old


def test_reset_times_read_as_openai_writes_them() -> None:
    assert [duration_text(s) for s in (0.2, 59.1, 60, 3723)] == ["1s", "1m0s", "1m0s", "1h2m3s"]


def test_every_answer_says_what_is_left_of_each_limit() -> None:
    q = quotas(requests_per_minute=3, tokens_per_day=100)
    assert q.standing("a", 0.0) == {
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "0s",
    }
    assert q.refusal("a", 10.0) is None
    q.spent("a", 12.0, 30)
    standing = q.standing("a", 20.0)
    assert standing["x-ratelimit-remaining-requests"] == "2"
    assert standing["x-ratelimit-reset-requests"] == "50s"
    assert standing["x-ratelimit-remaining-tokens"] == "70"
    assert standing["x-ratelimit-reset-tokens"] == "23h59m52s"
    assert q.standing("free", 20.0) == {} and q.standing("", 20.0) == {}
