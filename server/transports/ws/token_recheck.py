"""Which open connections' tokens a gateway must read again: the backstop that closes a revoked
token's connections when its revocation message was lost (no shared bus, a bus outage).

Reading every open token each period costs a statement as long as the connections (3.8 ms of
CPU for 1 000 tokens on SQLite, every 5 s). The store's revocation count moves exactly when a
token is revoked, so a token found live after the count was read stays live while the count
stays put: each period reads the count, and the tokens only when it moved, or those of
connections opened since the last read. Expiry is not this check's business: every connection
has a timer for its token's expiry.
"""

from __future__ import annotations

from collections.abc import Set


class TokenRecheck:
    """The tokens verified live at one revocation count. Pure logic: the gateway reads."""

    __slots__ = ("_count", "_live")

    def __init__(self) -> None:
        self._count: int | None = None
        self._live: set[str] = set()

    def to_read(self, count: int, open_tokens: Set[str]) -> set[str]:
        """The tokens of `open_tokens` to read, the revocation count being `count` (read before
        the tokens are): all of them when it moved, else those not yet found live."""
        if count != self._count:
            self._count, self._live = count, set()
        self._live &= open_tokens  # forget closed connections' tokens
        return set(open_tokens - self._live)

    def found_live(self, live: Set[str]) -> None:
        """`live` were read live after the count `to_read` was given: they stay so until the
        count moves."""
        self._live |= live


__all__ = ["TokenRecheck"]
