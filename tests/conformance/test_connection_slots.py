"""Connection caps through the limiter: one suite for the in-process and the Redis counters.

The limiter's keys must keep each cap exact and keep a gateway's periodic refresh a bounded
number of script calls on a Redis Cluster (one per hash slot), however many subjects connect.
"""

from __future__ import annotations

import pytest

from realtime.counters import Counters, RedisCounters
from runtime.domain import Principal
from runtime.errors import TooManyConnections
from server.live.quotas import CONNECTION_TAGS, Limiter, connection_keys
from server.settings import Settings


def tag(key: str) -> str:
    """The hash tag of `key`: what Redis Cluster hashes."""
    return key[key.index("{") : key.index("}") + 1]


def user(subject: str, *scopes: str) -> Principal:
    return Principal(subject=subject, role="user", scopes=frozenset(scopes or ("s",)))


async def test_caps_count_per_token_and_per_subject_within_its_scopes(counters: Counters) -> None:
    settings = Settings(ws_max_connections_per_token=2, ws_max_connections_per_subject=3)
    limiter = Limiter(settings, counters)
    alice = user("alice")
    first = [await limiter.connect(alice, "t1") for _ in range(2)]
    with pytest.raises(TooManyConnections, match="token"):
        await limiter.connect(alice, "t1")
    await limiter.connect(alice, "t2")  # another token of alice: the subject's third
    with pytest.raises(TooManyConnections, match="subject"):
        await limiter.connect(alice, "t3")
    # The same subject name in another scope is another caller, with caps of its own.
    await limiter.connect(user("alice", "other"), "t4")
    await limiter.disconnect(first[0])
    await limiter.connect(alice, "t3")


async def test_a_gateways_refresh_is_bounded_by_the_tags_not_the_subjects(
    counters: Counters,
) -> None:
    limiter = Limiter(Settings(), counters)
    slots = [await limiter.connect(user(f"user-{n}"), f"token-{n}") for n in range(600)]
    # Every connection's two keys share one tag, and the tags are a fixed set.
    tags = {tag(key) for slot in slots for key in slot.keys}
    assert len(tags) <= CONNECTION_TAGS
    assert all(len({tag(key) for key in slot.keys}) == 1 for slot in slots)
    if isinstance(counters, RedisCounters):
        before = counters.batcher.scripts
        await limiter.keep_many(slots)
        sent = counters.batcher.scripts - before
        # A single Redis takes the refresh in a few calls (chunks of members); a cluster in at
        # most one per hash slot the tags fall on, never one per subject.
        assert 1 <= sent <= CONNECTION_TAGS, sent
    else:
        await limiter.keep_many(slots)
    # Refreshed members still count: a full subject stays full.
    settings = Settings(ws_max_connections_per_subject=1)
    capped = Limiter(settings, counters)
    with pytest.raises(TooManyConnections, match="subject"):
        await capped.connect(user("user-7"), "token-7b")


def test_keys_of_a_token_share_one_tag_and_distinct_subjects_keep_distinct_sets() -> None:
    a, b = connection_keys(user("a"), "t"), connection_keys(user("b"), "t")
    assert tag(a[0]) == tag(a[1])
    assert a[1] != b[1]
    assert connection_keys(user("a", "x"), "t")[1] != connection_keys(user("a", "y"), "t")[1]
