"""Names of bus channels and replay keys (the bus backend adds its own prefix)."""

from __future__ import annotations


def _check(thread_id: str) -> str:
    if not thread_id:
        raise ValueError("thread_id must be a non-empty string")
    return thread_id


def thread_channel(thread_id: str) -> str:
    """The channel carrying a thread's live chunks and watch invalidations."""
    return f"thread:{_check(thread_id)}"


def replay_key(thread_id: str) -> str:
    """The replay buffer holding the in-flight step's chunks of a thread."""
    return f"replay:{_check(thread_id)}"
