"""PrincipalCache: entries end at the ttl or the token's expiry, whichever is first; a
revocation forgets its token and voids reads that began before it; the size is bounded."""

from __future__ import annotations

from runtime.domain import Principal, Role
from server.auth_cache import PrincipalCache

ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({"acme"}))
HASH = "a" * 64
OTHER = "b" * 64


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_the_ttl_or_until_the_token_expires() -> None:
    clock = Clock()
    cache = PrincipalCache(2.0, clock=clock)
    cache.put(HASH, ALICE, None, cache.ticket())
    cache.put(OTHER, ALICE, 0.5, cache.ticket())  # expires before the ttl
    assert cache.get(HASH) == ALICE and cache.get(OTHER) == ALICE
    clock.now += 0.5
    assert cache.get(HASH) == ALICE and cache.get(OTHER) is None
    clock.now += 1.5
    assert cache.get(HASH) is None
    cache.put(HASH, ALICE, 0.0, cache.ticket())  # already expired: not kept
    assert cache.get(HASH) is None and len(cache) == 0


def test_a_revocation_forgets_the_token_and_voids_reads_begun_before_it() -> None:
    cache = PrincipalCache(60.0, clock=Clock())
    cache.put(HASH, ALICE, None, cache.ticket())
    before = cache.ticket()  # a read starts ...
    cache.forget(HASH[:24])  # ... the token is revoked meanwhile ...
    assert cache.get(HASH) is None
    cache.put(HASH, ALICE, None, before)  # ... so what it read is not kept
    assert cache.get(HASH) is None
    cache.put(HASH, ALICE, None, cache.ticket())  # a read after the revocation is
    assert cache.get(HASH) == ALICE


def test_only_the_exact_hash_is_served_and_the_size_is_bounded() -> None:
    cache = PrincipalCache(60.0, max_entries=2, clock=Clock())
    cache.put(HASH, ALICE, None, cache.ticket())
    assert cache.get(HASH[:24] + "0" * 40) is None  # same key, another token
    cache.put(OTHER, ALICE, None, cache.ticket())
    cache.put("c" * 64, ALICE, None, cache.ticket())
    assert len(cache) <= 2 and cache.get("c" * 64) == ALICE
