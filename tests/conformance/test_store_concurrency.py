"""Store conformance: concurrent writers, several processes on one database, retries, metrics."""

from __future__ import annotations

import asyncio

from runtime.domain import InputPolicy
from runtime.storage.store import StepCommit, Store
from tests.conformance.conftest import StoreFactory
from tests.conformance.store_helpers import (
    SCOPES,
    assert_contiguous,
    assistant,
    new_thread,
    start_run,
    text,
)


async def version_of(store: Store, thread_id: str) -> int:
    return (await store.get_thread(thread_id, SCOPES)).version


async def test_concurrent_writers_lose_nothing_and_versions_have_no_gaps(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    doomed = [
        await store.submit_input(thread.id, SCOPES, text=f"doomed {i}", submitted_by="a")
        for i in range(5)
    ]
    start = await version_of(store, thread.id)
    submits = [
        store.submit_input(thread.id, SCOPES, text=f"queued {i}", submitted_by="bob")
        for i in range(8)
    ]
    commits = [
        store.commit(lease, StepCommit(append=(assistant(text(f"step {i}")),))) for i in range(7)
    ]
    cancels = [
        store.cancel_queued_item(thread.id, SCOPES, item.queued_item_id or "") for item in doomed
    ]
    results = await asyncio.gather(*submits, *commits, *cancels)
    versions = [r.version for r in results if not isinstance(r, int)]
    versions += [r for r in results if isinstance(r, int)]
    assert_contiguous(versions, start)
    assert await version_of(store, thread.id) == start + 20
    messages = await store.list_messages(thread.id)
    assert sorted(m.text() for m in messages[1:]) == sorted(f"step {i}" for i in range(7))
    assert [m.position for m in messages] == list(range(8))
    queue = await store.list_queue(thread.id)
    assert sorted(q.text for q in queue) == sorted(f"queued {i}" for i in range(8))


async def test_concurrent_submits_on_an_idle_thread_start_one_run(store: Store) -> None:
    thread = await new_thread(store)
    results = await asyncio.gather(
        *(store.submit_input(thread.id, SCOPES, text=f"m{i}", submitted_by="a") for i in range(12))
    )
    assert_contiguous([r.version for r in results], 1)
    assert sum(r.run_id is not None for r in results) == 1
    assert sum(r.queued_item_id is not None for r in results) == 11
    assert len(await store.list_messages(thread.id)) == 1


async def test_concurrent_duplicates_create_one_admission(store: Store) -> None:
    thread = await new_thread(store)
    results = await asyncio.gather(
        *(
            store.submit_input(
                thread.id, SCOPES, text="once", submitted_by="a", client_request_id="same"
            )
            for _ in range(10)
        )
    )
    originals = [r for r in results if not r.duplicate]
    assert len(originals) == 1
    assert {r.message_id for r in results} == {originals[0].message_id}
    assert await version_of(store, thread.id) == 2


async def test_concurrent_lease_acquisition_has_one_winner(store: Store) -> None:
    thread = await new_thread(store)
    admission = await store.submit_input(thread.id, SCOPES, text="go", submitted_by="a")
    leases = await asyncio.gather(
        *(store.acquire_run_lease(admission.run_id or "", f"w{i}", 10.0) for i in range(10))
    )
    assert sum(lease is not None for lease in leases) == 1


async def test_two_store_instances_share_one_database(make_store: StoreFactory) -> None:
    async with make_store() as one, make_store() as two:
        thread = await new_thread(one)
        results = await asyncio.gather(
            *(
                (one if i % 2 else two).submit_input(
                    thread.id, SCOPES, text=f"m{i}", submitted_by="a", policy=InputPolicy.ENQUEUE
                )
                for i in range(20)
            )
        )
        assert_contiguous([r.version for r in results], 1)
        assert await version_of(two, thread.id) == 21


# --- retries ------------------------------------------------------------------------------
