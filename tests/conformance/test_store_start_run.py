"""Store conformance: `start_run`, the run lease with the episode's start: in one statement
(Postgres' database function) or in one transaction (SQLite)."""

from __future__ import annotations

import asyncio

from runtime.domain import RunStatus
from runtime.storage.store import RunStart, StartedRun, Store
from tests.conformance.store_helpers import (
    SCOPES,
    finish,
    new_thread,
    queued_run,
    start_run,
    suspend,
)

SHORT_TTL = 0.3


async def started(store: Store, start: RunStart) -> StartedRun:
    """What `start_run` started, or, where it left the start to the caller, `begin_episode`'s."""
    if start.started is not None:
        return start.started
    return await store.begin_episode(start.lease)


async def test_start_run_leases_and_starts_a_queued_run(store: Store) -> None:
    thread_id, run_id = await queued_run(store)
    version = (await store.get_thread(thread_id, SCOPES)).version
    start = await store.start_run(run_id, "w1", 10.0)
    assert start is not None
    assert (start.lease.resource_id, start.lease.thread_id, start.lease.owner) == (
        run_id,
        thread_id,
        "w1",
    )
    # The store may leave the start to begin_episode (`started` None); these both start it.
    assert start.started is not None
    began = await started(store, start)
    assert (began.before.status, began.before.episode) == (RunStatus.QUEUED, 0)
    assert (began.run.status, began.run.episode) == (RunStatus.RUNNING, 1)
    # queued -> running is a visible change: one version, which the thread says too.
    assert began.version == version + 1 == began.thread.version
    stored = await store.get_thread(thread_id, SCOPES)
    assert stored.version == began.version
    assert stored.model_dump(exclude={"updated_at"}) == began.thread.model_dump(
        exclude={"updated_at"}
    )
    assert (await store.get_run(run_id)).model_dump(exclude={"updated_at"}) == (
        began.run.model_dump(exclude={"updated_at"})
    )
    # The lease is live: nobody else gets the run, its owner included.
    assert await store.start_run(run_id, "w2", 10.0) is None
    assert await store.start_run(run_id, "w1", 10.0) is None
    # And it fences: the episode commits under it.
    await finish(store, start.lease)
    assert (await store.get_run(run_id)).status is RunStatus.COMPLETED


async def test_start_run_refuses_what_acquire_run_lease_refuses(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease)
    await store.release_lease(lease)
    run_id = admission.run_id or ""
    version = (await store.get_thread(thread.id, SCOPES)).version
    # Waiting with nothing to do: no lease, nothing started.
    assert await store.start_run(run_id, "w2", 10.0) is None
    await store.request_stop(thread.id, SCOPES, run_id)
    # Waiting with a stop request: leased to be finalised, in a new episode that stays waiting
    # (no visible change, no version).
    start = await store.start_run(run_id, "w2", 10.0)
    assert start is not None
    began = await started(store, start)
    assert (began.before.status, began.run.status) == (RunStatus.WAITING, RunStatus.WAITING)
    assert began.run.episode == began.before.episode + 1
    assert began.run.stop_requested
    assert began.version == version == (await store.get_thread(thread.id, SCOPES)).version
    await finish(store, start.lease, RunStatus.CANCELLED)
    assert await store.start_run(run_id, "w3", 10.0) is None  # ended


async def test_start_run_takes_over_an_expired_lease(store: Store) -> None:
    thread_id, run_id = await queued_run(store)
    first = await store.start_run(run_id, "w1", SHORT_TTL)
    assert first is not None
    first_start = await started(store, first)
    await asyncio.sleep(SHORT_TTL + 0.2)
    second = await store.start_run(run_id, "w2", 10.0)
    assert second is not None and second.lease.token > first.lease.token
    began = await started(store, second)
    # A takeover: the run was running already (no version), one episode later.
    assert (began.before.status, began.before.episode) == (RunStatus.RUNNING, 1)
    assert (began.run.status, began.run.episode) == (RunStatus.RUNNING, 2)
    assert began.version == first_start.version
    assert (await store.get_thread(thread_id, SCOPES)).version == began.version


async def test_concurrent_start_runs_grant_one_lease_and_one_start(store: Store) -> None:
    """Workers racing for one run: one lease, one episode, one version; the others get None."""
    thread_id, run_id = await queued_run(store)
    version = (await store.get_thread(thread_id, SCOPES)).version
    starts = await asyncio.gather(*(store.start_run(run_id, f"w{i}", 10.0) for i in range(8)))
    granted: list[RunStart] = [start for start in starts if start is not None]
    assert len(granted) == 1
    await started(store, granted[0])
    run = await store.get_run(run_id)
    assert (run.status, run.episode) == (RunStatus.RUNNING, 1)
    assert (await store.get_thread(thread_id, SCOPES)).version == version + 1


async def test_start_run_reads_the_named_threads_messages_with_the_start(
    store: Store,
) -> None:
    """With the run's thread named, a start made with the lease (Postgres) reads the thread's
    messages from the given position, as `read_history` reads them after it; a wrong thread
    or none named reads nothing. Where the start is left to `begin_episode`, so is the read."""
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id, text="one")
    await finish(store, lease)
    await store.submit_input(thread.id, SCOPES, text="two", submitted_by="alice")
    run = await store.active_run(thread.id)
    assert run is not None
    for thread_id, history_from in ((thread.id, 0), (thread.id, 1), ("th_other", 0), (None, 0)):
        start = await store.start_run(
            run.id, "w1", 10.0, thread_id=thread_id, history_from=history_from
        )
        assert start is not None and start.started is not None
        if thread_id != thread.id:
            assert start.history is None
        else:
            assert start.history == await store.read_history(thread.id, history_from)
            assert len(start.history.messages) == 2 - history_from
        await store.release_lease(start.lease)
