"""Store conformance: tokens that expire and tokens that are revoked are refused."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import Role
from runtime.errors import InvalidInput
from runtime.storage import SqlStore


async def test_a_revoked_token_is_refused_and_revoking_twice_says_so(store: SqlStore) -> None:
    await store.create_token("h1", "alice", Role.USER, ["acme"])
    assert (await store.principal_for_token("h1")) is not None
    assert await store.revoke_token("h1") is True
    assert await store.principal_for_token("h1") is None
    assert await store.revoke_token("h1") is False
    assert await store.revoke_token("unknown") is False


async def test_a_token_expires_on_the_database_clock(store: SqlStore) -> None:
    await store.create_token("h2", "bob", Role.USER, ["acme"], expires_in=1.0)
    await store.create_token("h3", "bob", Role.USER, ["acme"])
    assert (await store.principal_for_token("h2")) is not None
    remaining = await store.token_expires_in("h2")
    assert remaining is not None and 0.5 < remaining <= 1.0
    assert await store.token_expires_in("h3") is None  # never expires
    assert await store.token_expires_in("unknown") is None
    await asyncio.sleep(1.2)
    assert await store.principal_for_token("h2") is None
    assert await store.token_expires_in("h2") == 0.0
    assert (await store.principal_for_token("h3")) is not None
    with pytest.raises(InvalidInput):
        await store.create_token("h4", "bob", Role.USER, ["acme"], expires_in=0)
