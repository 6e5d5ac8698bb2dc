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


def scope_channel(scope: str) -> str:
    """The channel announcing, per scope, which thread committed which version (the action
    inbox refetches that thread's pending actions from it)."""
    if not scope:
        raise ValueError("scope must be a non-empty string")
    return f"scope:{scope}"


def presence_channel(thread_id: str) -> str:
    """The channel saying "the presence set of this thread changed: reread it"."""
    return f"presence:{_check(thread_id)}"


def presence_key(thread_id: str) -> str:
    """Where the members present in a thread live (a hash: member id -> entry)."""
    return f"presence:{_check(thread_id)}"
