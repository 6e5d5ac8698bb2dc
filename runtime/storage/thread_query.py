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
    updated_at: float
    thread_id: str


def page_cursor(thread: Thread) -> str:
    """The cursor after `thread`: its place in the order (update time, id), opaque to clients.

    A keyset, not an offset: threads created meanwhile sort before it (they are newer), so
    the pages after it neither repeat nor skip a thread because of them."""
    raw = orjson.dumps([thread.updated_at, thread.id])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def read_cursor(cursor: str) -> CursorPosition:
    """The position a `page_cursor` names; `InvalidInput` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        updated_at, thread_id = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError) as exc:
        raise InvalidInput("cursor is not one this server gave") from exc
    if (
        not isinstance(updated_at, int | float)
        or isinstance(updated_at, bool)
        or not math.isfinite(updated_at)
        or not isinstance(thread_id, str)
    ):
        raise InvalidInput("cursor is not one this server gave")
    return CursorPosition(float(updated_at), thread_id)


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
    "merge_patch",
    "page_cursor",
    "read_cursor",
]
