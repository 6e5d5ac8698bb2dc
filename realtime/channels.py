"""Names of bus channels and replay keys (the bus backend adds its own prefix).

Every name of a thread carries the thread's hash tag (`{<thread id>}`), so on a Redis Cluster
its channel, replay buffer and presence hash all live on one shard; a plain Redis ignores the
braces. A scope's channel carries the scope's tag.
"""

from __future__ import annotations

import hashlib


def hash_tag(value: str) -> str:
    """`{value}`: what Redis Cluster hashes instead of the whole name. A value Redis could not
    use as a tag (empty, or holding a `}` that would end it early) is replaced by its digest,
    so distinct values keep distinct tags."""
    if not value or "}" in value:
        value = hashlib.sha1(value.encode()).hexdigest()[:16]
    return "{" + value + "}"


def _check(thread_id: str) -> str:
    if not thread_id:
        raise ValueError("thread_id must be a non-empty string")
    return hash_tag(thread_id)


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
    return f"scope:{hash_tag(scope)}"


def presence_channel(thread_id: str) -> str:
    """The channel saying "the presence set of this thread changed: reread it"."""
    return f"presence:{_check(thread_id)}"


def presence_key(thread_id: str) -> str:
    """Where the members present in a thread live: a hash, gateway id -> that gateway's
    members there (one JSON object by member id). Not `presence:` (per-connection fields with
    their own expiry, before 2026-12-02): gateways of both layouts never read each other's."""
    return f"presence-gw:{_check(thread_id)}"


def gateway_key(gateway: str) -> str:
    """Set while a gateway is alive (it expires unless the gateway keeps setting it): its
    members in every thread's `presence_key` hash count only while this key exists."""
    if not gateway:
        raise ValueError("gateway must be a non-empty string")
    return f"presence-alive:{gateway}"
