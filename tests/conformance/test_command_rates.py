"""Command rates through the limiter: one suite for the in-process and the Redis counters.

A command draws one from its token's bucket and from each of its scopes' (keys of different
slots on a Redis Cluster); refused, it draws from none, and the refusal names the empty one.
"""

from __future__ import annotations

import pytest

from realtime.counters import Counters
from runtime.domain import Principal
from runtime.errors import ScopeRateLimited, TokenRateLimited
from server.live.quotas import Limiter
from server.settings import Settings


def user(subject: str, *scopes: str) -> Principal:
    return Principal(subject=subject, role="user", scopes=frozenset(scopes))


async def test_a_command_is_charged_to_its_token_and_scopes_or_to_none(
    counters: Counters,
) -> None:
    settings = Settings(token_rate=0.001, token_burst=3, scope_rate=0.001, scope_burst=2)
    limiter = Limiter(settings, counters)
    alice, bob = user("alice", "acme", "globex"), user("bob", "acme")
    await limiter.command(alice, "ta")
    await limiter.command(bob, "tb")  # acme is empty now; globex has one left
    with pytest.raises(ScopeRateLimited, match="'acme'") as refused:
        await limiter.command(alice, "ta")
    assert refused.value.retry_after is not None and refused.value.retry_after > 0
    # The refusal took nothing: alice's token still has two, globex still one.
    carol = user("carol", "globex")
    await limiter.command(carol, "tc")
    with pytest.raises(ScopeRateLimited, match="'globex'"):
        await limiter.command(carol, "tc")
    dave = user("dave", "initech")
    await limiter.command(dave, "ta")  # alice's token, another scope: its second
    await limiter.command(dave, "ta")  # and its third
    with pytest.raises(TokenRateLimited):
        await limiter.command(dave, "ta")
