"""Priority classes by name: what the config and a request's header name them, and their order."""

from __future__ import annotations

import pytest

from statemachine import RequestClass


@pytest.mark.parametrize(
    ("text", "klass"),
    [
        ("interactive", RequestClass.INTERACTIVE),
        ("standard", RequestClass.STANDARD),
        ("batch", RequestClass.BATCH),
    ],
)
def test_each_class_is_found_by_its_label(text: str, klass: RequestClass) -> None:
    assert RequestClass.named(text) is klass and klass.label == text


@pytest.mark.parametrize("text", ["", "Batch", "urgent", "0", "standard "])
def test_any_other_name_is_none(text: str) -> None:
    assert RequestClass.named(text) is None


def test_lower_is_served_first() -> None:
    assert RequestClass.INTERACTIVE < RequestClass.STANDARD < RequestClass.BATCH
