"""Retention durations and the policy carried by its timer's ref (pure)."""

from __future__ import annotations

import pytest

from runtime.storage.retention import RetentionPolicy, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400.0),
        ("12h", 43200.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("2w", 1209600.0),
        ("3600", 3600.0),
        ("0.5", 0.5),
        (" 1H ", 3600.0),
        (7, 7.0),
    ],
)
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1x", "h1", "1h 30m", "0", "-5", "0s", "1h-1m"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_a_policy_survives_its_ref() -> None:
    policy = RetentionPolicy(idle_for=30 * 86400.0, interval=0.1)
    assert RetentionPolicy.of_ref(policy.ref) == policy
    assert RetentionPolicy.of_ref(policy.ref).ref == policy.ref
