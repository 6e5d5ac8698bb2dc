"""Finding threads: the list filter, its opaque page cursor, and metadata merge patches."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from runtime.authorization import ThreadMatch
from runtime.domain import Thread
from runtime.errors import InvalidInput


class ThreadStatus(StrEnum):
    """What a thread is doing, as the list filters it: its active run's state, or none."""

    IDLE = "idle"  # no queued, running or waiting run
    RUNNING = "running"  # a run queued or running
    WAITING = "waiting"  # a run waiting for an action (approval, client tool, input)


@dataclass(frozen=True)
class ThreadQuery:
    """Which threads `list_threads` answers, newest update first, then by id.

    `metadata`: public metadata keys that must hold these string values (all of them);
    `updated_after`/`updated_before`: bounds on `updated_at` (epoch seconds, exclusive);
    `after`: the cursor of the previous page (`page_cursor` of its last thread);
    `allowed`: an authorization hook's narrowing (`Narrow.any_of`): only threads matching one
    of them (None: no narrowing; empty: none at all), applied by the store so pages are exact.
    """

    metadata: Mapping[str, str] = field(default_factory=dict)
    status: ThreadStatus | None = None
    updated_after: float | None = None
    updated_before: float | None = None
    after: str | None = None
    allowed: tuple[ThreadMatch, ...] | None = None


@dataclass(frozen=True)
class CursorPosition:
    """A place in a list ordered by a time, then an id: the row a page ended with."""

    at: float
    key: str


def keyset_cursor(at: float, key: str) -> str:
    """The cursor after the row at (`at`, `key`), opaque to clients: a keyset, not an offset,
    so rows added meanwhile elsewhere in the order neither repeat nor skip one of a page."""
    raw = orjson.dumps([at, key])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def page_cursor(thread: Thread) -> str:
    """The cursor after `thread` in the thread list (update time, id): threads updated
    meanwhile sort before it (they are newer)."""
    return keyset_cursor(thread.updated_at, thread.id)


def read_cursor(cursor: str) -> CursorPosition:
    """The position a `keyset_cursor` names; `InvalidInput` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, key = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError) as exc:
        raise InvalidInput("cursor is not one this server gave") from exc
    if (
        not isinstance(at, int | float)
        or isinstance(at, bool)
        or not math.isfinite(at)
        or not isinstance(key, str)
    ):
        raise InvalidInput("cursor is not one this server gave")
    return CursorPosition(float(at), key)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: objects merge key by key, `null` removes a key, anything
    else replaces the value whole (arrays included)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


__all__ = [
    "CursorPosition",
    "ThreadQuery",
    "ThreadStatus",
    "keyset_cursor",
    "merge_patch",
    "page_cursor",
    "read_cursor",
]
