"""Values of a type the interface forbids, for the tests that check a backend refuses them."""

from __future__ import annotations

from typing import Any


def ill_typed(value: object) -> Any:
    """`value`, hidden from the type checker: a caller without type checking (or over the wire)
    can pass it, so the backend must refuse it at runtime; mypy would reject it here."""
    return value
