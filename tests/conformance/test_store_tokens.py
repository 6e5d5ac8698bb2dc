"""Store conformance: tokens that expire and tokens that are revoked are refused."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import Role
from runtime.errors import InvalidInput
from runtime.storage.store import Store


async def test_a_revoked_token_is_refused_and_revoking_twice_says_so(store: Store) -> None:
    await store.create_token("h1", "alice", Role.USER, ["acme"])
    assert (await store.principal_for_token("h1")) is not None
    assert await store.revoke_token("h1") is True
    assert await store.principal_for_token("h1") is None
    assert await store.token_grant("h1") is None
    assert await store.revoke_token("h1") is False
    assert await store.revoke_token("unknown") is False


async def test_the_revocation_count_moves_exactly_when_a_token_is_revoked(store: Store) -> None:
    start = await store.revocation_count()
    for n in range(12):
        await store.create_token(f"rc{n}", "carl", Role.USER, ["acme"], expires_in=0.3)
    assert await store.revocation_count() == start  # minting revokes nothing
    assert await store.revoke_token("rc0") is True
    assert await store.revocation_count() == start + 1
    assert await store.revoke_token("rc0") is False  # already revoked: no move
    assert await store.revoke_token("unknown") is False
    assert await store.revocation_count() == start + 1
    # Concurrent revocations each count (one transaction each; none is lost).
    revoked = await asyncio.gather(*(store.revoke_token(f"rc{n}") for n in range(1, 11)))
    assert all(revoked)
    assert await store.revocation_count() == start + 11
    await asyncio.sleep(0.5)  # rc11 expires: expiry is not a revocation
    assert await store.revocation_count() == start + 11


async def test_a_token_expires_on_the_database_clock(store: Store) -> None:
    await store.create_token("h2", "bob", Role.USER, ["acme"], expires_in=1.0)
    await store.create_token("h3", "bob", Role.USER, ["acme"])
    assert (await store.principal_for_token("h2")) is not None
    remaining = await store.token_expires_in("h2")
    assert remaining is not None and 0.5 < remaining <= 1.0
    # The principal and the time left in one read: what the gateways' principal cache keeps.
    granted, also_remaining = await store.token_grant("h2") or (None, None)
    assert granted == await store.principal_for_token("h2")
    assert also_remaining is not None and 0.5 < also_remaining <= 1.0
    assert await store.token_grant("h3") == (await store.principal_for_token("h3"), None)
    assert await store.token_grant("unknown") is None
    assert await store.token_expires_in("h3") is None  # never expires
    assert await store.token_expires_in("unknown") is None
    await asyncio.sleep(1.2)
    assert await store.principal_for_token("h2") is None
    assert await store.token_grant("h2") is None
    assert await store.token_expires_in("h2") == 0.0
    assert (await store.principal_for_token("h3")) is not None
    with pytest.raises(InvalidInput):
        await store.create_token("h4", "bob", Role.USER, ["acme"], expires_in=0)


async def test_live_tokens_are_those_neither_revoked_expired_nor_unknown(store: Store) -> None:
    await store.create_token("l1", "ann", Role.USER, ["acme"])
    await store.create_token("l2", "ann", Role.USER, ["acme"])
    await store.create_token("l3", "ann", Role.USER, ["acme"], expires_in=0.5)
    await store.create_token("l4", "ann", Role.USER, ["acme"], expires_in=3600)
    asked = ["l1", "l2", "l3", "l4", "unknown", "l1"]
    assert await store.live_tokens(asked) == {"l1", "l2", "l3", "l4"}
    assert await store.revoke_token("l2") is True
    await asyncio.sleep(0.7)
    assert await store.live_tokens(asked) == {"l1", "l4"}
    assert await store.live_tokens([]) == set()
    # Many at once (more than one statement's worth): the same answer as one by one.
    many = [f"m{i}" for i in range(1205)]
    for token_hash in many[::100]:
        await store.create_token(token_hash, "ann", Role.USER, ["acme"])
    assert await store.live_tokens([*many, "l1"]) == {*many[::100], "l1"}


async def test_a_token_carries_its_display_name(store: Store) -> None:
    await store.create_token("n1", "u-81", Role.USER, ["acme"], display_name="  Ann Lee ")
    await store.create_token("n2", "u-82", Role.USER, ["acme"])
    named = await store.principal_for_token("n1")
    plain = await store.principal_for_token("n2")
    assert named is not None and named.display_name == "Ann Lee" and named.name == "Ann Lee"
    assert plain is not None and plain.display_name is None and plain.name == "u-82"


@pytest.mark.parametrize("bad", ["", "   ", "x" * 65, "tab\there", "line\nbreak"])
async def test_a_bad_display_name_is_refused_and_creates_nothing(store: Store, bad: str) -> None:
    with pytest.raises(InvalidInput, match="display name"):
        await store.create_token("n3", "u-83", Role.USER, ["acme"], display_name=bad)
    assert await store.principal_for_token("n3") is None


async def test_a_token_carries_its_groups(store: Store) -> None:
    await store.create_token("g1", "u-91", Role.USER, ["acme"], groups=["ops", " oncall", "ops"])
    await store.create_token("g2", "u-92", Role.USER, ["acme"])
    grouped = await store.principal_for_token("g1")
    plain = await store.principal_for_token("g2")
    assert grouped is not None and grouped.groups == {"ops", "oncall"}
    assert plain is not None and plain.groups == frozenset()


@pytest.mark.parametrize("bad", [[""], ["x" * 129], ["tab\there"], [f"g{n}" for n in range(51)]])
async def test_bad_groups_are_refused_and_create_nothing(store: Store, bad: list[str]) -> None:
    with pytest.raises(InvalidInput, match="group"):
        await store.create_token("g3", "u-93", Role.USER, ["acme"], groups=bad)
    assert await store.principal_for_token("g3") is None
