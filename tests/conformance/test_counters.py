"""Quota counters: one suite for the in-process and the Redis backend."""

from __future__ import annotations

import asyncio

from realtime.counters import Counters, RedisCounters


async def test_bucket_allows_the_burst_then_says_how_long_to_wait(counters: Counters) -> None:
    answers = [await counters.take("b", rate=2.0, burst=5) for _ in range(8)]
    assert answers[:5] == [0.0] * 5
    assert all(0 < wait <= 0.5 + 1e-6 for wait in answers[5:]), answers
    await asyncio.sleep(0.6)  # refills one token at 2/s
    assert await counters.take("b", rate=2.0, burst=5) == 0.0
    assert await counters.take("b", rate=2.0, burst=5) > 0
    # Another key has a bucket of its own.
    assert await counters.take("other", rate=2.0, burst=5) == 0.0


async def test_connection_sets_cap_every_key_and_add_nothing_when_one_is_full(
    counters: Counters,
) -> None:
    keys, caps = ("token:{s}:a", "subject:{s}"), (2, 3)
    assert await counters.join(keys, caps, "c1", ttl=30) == -1
    assert await counters.join(keys, caps, "c2", ttl=30) == -1
    assert await counters.join(keys, caps, "c3", ttl=30) == 0  # the token's set is full
    # The subject's set did not get c3: another token of the subject still fits once.
    assert await counters.join(("token:{s}:b", "subject:{s}"), caps, "c4", ttl=30) == -1
    assert await counters.join(("token:{s}:b", "subject:{s}"), caps, "c5", ttl=30) == 1
    await counters.leave(keys, "c1")
    assert await counters.join(keys, caps, "c6", ttl=30) == -1


async def test_members_expire_unless_refreshed(counters: Counters) -> None:
    keys, caps = ("token:x",), (1,)
    assert await counters.join(keys, caps, "old", ttl=0.3) == -1
    assert await counters.join(keys, caps, "new", ttl=0.3) == 0
    await asyncio.sleep(0.2)
    await counters.refresh(keys, "old", ttl=0.3)
    await asyncio.sleep(0.2)
    assert await counters.join(keys, caps, "new", ttl=0.3) == 0  # refreshed: still there
    await asyncio.sleep(0.4)
    assert await counters.join(keys, caps, "new", ttl=0.3) == -1  # lapsed


async def test_many_members_refreshed_together_stay_and_the_others_lapse(
    counters: Counters,
) -> None:
    # More slots than one batch holds (512), each its own key like a connection's token set.
    slots = [((f"token:{{s{i}}}:t",), f"c{i}") for i in range(1100)]
    joined = await asyncio.gather(*(counters.join(k, (1,), m, ttl=1.5) for k, m in slots))
    assert joined == [-1] * len(slots)
    await counters.join(("token:{left}:t",), (1,), "gone", ttl=30)
    await counters.leave(("token:{left}:t",), "gone")
    await asyncio.sleep(0.9)
    kept = slots[::2]
    await counters.refresh_many([*kept, (("token:{left}:t",), "gone")], ttl=1.5)
    await asyncio.sleep(0.9)
    # A refreshed member still fills its set; the others lapsed and left room.
    newcomers = await asyncio.gather(*(counters.join(k, (1,), "new", ttl=30) for k, _ in slots))
    assert newcomers == [0 if index % 2 == 0 else -1 for index in range(len(slots))]
    # A refresh never adds back a member that left.
    assert await counters.join(("token:{left}:t",), (1,), "newcomer", ttl=30) == -1


async def test_redis_counters_fall_back_to_this_process_when_redis_is_down() -> None:
    # Nothing listens on port 1: every call fails fast and is counted locally instead.
    down = RedisCounters("redis://127.0.0.1:1/0", "down:", timeout=0.2)
    try:
        answers = [await down.take("b", rate=1.0, burst=2) for _ in range(3)]
        assert answers[:2] == [0.0, 0.0] and answers[2] > 0
        assert not down.shared
        assert await down.join(("k",), (1,), "m1", ttl=30) == -1
        assert await down.join(("k",), (1,), "m2", ttl=30) == 0
    finally:
        await down.close()


async def test_several_buckets_are_taken_together_or_not_at_all(counters: Counters) -> None:
    # A token's bucket and its scopes' (as the limiter charges a command): on a cluster the
    # keys are of different hash slots.
    token, scope = ("rate:token:t1", 0.001, 3), ("rate:scope:s1", 0.001, 2)
    other = ("rate:token:t2", 0.001, 3)
    assert await counters.take_all([token, scope]) == (-1, 0.0)
    assert await counters.take_all([other, scope]) == (-1, 0.0)
    # The scope is empty: refused by it (index 1, a wait), and the token keeps its two.
    index, wait = await counters.take_all([token, scope])
    assert index == 1 and wait > 0
    assert await counters.take_all([token]) == (-1, 0.0)
    assert await counters.take_all([token]) == (-1, 0.0)
    # Now the token is the first bucket short of one: index 0, and the scope untouched.
    index, wait = await counters.take_all([token, ("rate:scope:s2", 0.001, 2)])
    assert index == 0 and wait > 0
    assert await counters.take_all([("rate:scope:s2", 0.001, 2)]) == (-1, 0.0)
    assert await counters.take_all([("rate:scope:s2", 0.001, 2)]) == (-1, 0.0)
    assert (await counters.take_all([("rate:scope:s2", 0.001, 2)]))[0] == 0
