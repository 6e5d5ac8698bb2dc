"""A short-lived per-process cache of `tl_` token -> principal, so a busy token costs no
storage read per request. Entries live `ttl` seconds at most and never past the token's expiry;
a revocation forgets the token at once in the process that revoked it and, through the
revocation broadcast (server/live/revocation.py), on every gateway."""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.domain import Principal

# Bounded: beyond it the cache starts over (a miss is one read, as without the cache).
MAX_ENTRIES = 10_000


class PrincipalCache:
    """Principals by token hash, each until `min(ttl, the token's time left)` from its read."""

    def __init__(
        self,
        ttl: float,
        *,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        # token key (a prefix of the hash, what revocations name) -> (hash, principal, until)
        self._entries: dict[str, tuple[str, Principal, float]] = {}
        # Counts revocations: a read that began before one is not kept (it may predate it).
        self._generation = 0

    def ticket(self) -> int:
        """Taken before a store read; `put` keeps its answer only if no revocation came since."""
        return self._generation

    def get(self, token_hash: str) -> Principal | None:
        key = token_hash[:KEY_CHARS]
        entry = self._entries.get(key)
        if entry is None or entry[0] != token_hash:
            return None
        if self._clock() >= entry[2]:
            del self._entries[key]
            return None
        return entry[1]

    def put(
        self, token_hash: str, principal: Principal, expires_in: float | None, ticket: int
    ) -> None:
        """Keep `principal` for `ttl` seconds, or until the token expires if that is sooner;
        not if a revocation came after `ticket` was taken (the read may be from before it)."""
        lifetime = self.ttl if expires_in is None else min(self.ttl, expires_in)
        if lifetime <= 0 or ticket != self._generation:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[token_hash[:KEY_CHARS]] = (token_hash, principal, self._clock() + lifetime)

    def forget(self, token_key: str) -> None:
        """Drop the token a revocation names (its `token_key`)."""
        self._generation += 1
        self._entries.pop(token_key, None)

    def __len__(self) -> int:
        return len(self._entries)


# A token key is this long a prefix of the token's hash (server.auth.token_key_of_hash).
KEY_CHARS = 24
