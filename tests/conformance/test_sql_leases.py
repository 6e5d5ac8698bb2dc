"""SQL stores only: refused lease calls write nothing; one-statement grants replay by key."""

from __future__ import annotations

import pytest

from runtime.domain import Lease, RunStatus
from runtime.errors import NotFound
from runtime.storage import SqlStore
from runtime.storage.sql import leases_tx
from runtime.storage.store import RunStart
from tests.conformance.store_helpers import (
    SCOPES,
    counts,
    queued_run,
)


async def test_acquire_of_an_unknown_run_raises_and_writes_nothing(sql_store: SqlStore) -> None:
    await queued_run(sql_store)
    before = await counts(sql_store)
    with pytest.raises(NotFound):
        await sql_store.acquire_run_lease("run_missing", "w1", 10.0)
    assert await counts(sql_store) == before


@pytest.mark.postgres
@pytest.mark.parametrize("make_sql_store", ["postgres"], indirect=True)
async def test_one_statement_grant_replays_after_an_unknown_outcome(sql_store: SqlStore) -> None:
    """On Postgres acquire_run_lease is one database function call (SQLite runs it as a
    transaction of statements): a retry of a call whose reply was lost (same key) answers the
    lease that call granted, and grants nothing more."""
    assert sql_store.dialect.run_lease_function is not None
    thread_id, run_id = await queued_run(sql_store)

    async def call(key: str, owner: str) -> Lease | None:
        async with sql_store.pool.autocommit() as conn:
            return await leases_tx.acquire_run_lease_call(conn, key, run_id, owner, 10.0)

    first = await call("tx_replay", "w1")
    assert first is not None and (first.owner, first.thread_id) == ("w1", thread_id)
    keys, counter = await counts(sql_store)
    assert counter == first.token
    assert await call("tx_replay", "w1") == first  # the lost reply, answered again
    assert await call("tx_replay", "w2") is None  # not this owner's lease: nothing to answer
    assert await call("tx_other", "w2") is None  # a new call: the live lease refuses
    assert await counts(sql_store) == (keys + 1, counter)
    await sql_store.release_lease(first)
    assert await call("tx_replay", "w1") is None  # released: nothing live to answer
    taken = await call("tx_after", "w2")
    assert taken is not None and taken.token == counter + 1


async def test_start_run_of_an_unknown_run_raises_and_writes_nothing(sql_store: SqlStore) -> None:
    await queued_run(sql_store)
    before = await counts(sql_store)
    with pytest.raises(NotFound):
        await sql_store.start_run("run_missing", "w1", 10.0)
    assert await counts(sql_store) == before


@pytest.mark.postgres
@pytest.mark.parametrize("make_sql_store", ["postgres"], indirect=True)
async def test_one_statement_start_replays_after_an_unknown_outcome(sql_store: SqlStore) -> None:
    """A retry of a `start_run` call whose reply was lost (same key) answers what that call
    did: the lease it granted this owner and the run as it was before the start, with the run
    and thread as they are now. It starts nothing twice and grants nothing more."""
    assert sql_store.dialect.start_run_function is not None
    thread_id, run_id = await queued_run(sql_store)

    async def call(key: str, owner: str) -> RunStart | None:
        async with sql_store.pool.autocommit() as conn:
            return await leases_tx.start_run_call(conn, key, run_id, owner, 10.0)

    first = await call("tx_start", "w1")
    assert first is not None and first.started is not None
    keys, counter = await counts(sql_store)
    version = (await sql_store.get_thread(thread_id, SCOPES)).version
    again = await call("tx_start", "w1")
    assert again is not None and again.lease == first.lease
    assert again.started is not None
    # How the episode began, as the first attempt saw it (a fresh start, not a takeover).
    assert again.started.before == first.started.before
    assert again.started.before.status is RunStatus.QUEUED
    assert (again.started.run.status, again.started.run.episode) == (RunStatus.RUNNING, 1)
    assert again.started.version == version
    assert await call("tx_start", "w2") is None  # not this owner's lease: nothing to answer
    assert await call("tx_other", "w2") is None  # a new call: the live lease refuses
    assert await counts(sql_store) == (keys + 1, counter)
    assert (await sql_store.get_run(run_id)).episode == 1
    assert (await sql_store.get_thread(thread_id, SCOPES)).version == version
    await sql_store.release_lease(first.lease)
    assert await call("tx_start", "w1") is None  # released: nothing live to answer
