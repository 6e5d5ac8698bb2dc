"""Transaction functions for leases on the database clock, and the fence of every runtime write."""

from __future__ import annotations

from runtime import telemetry
from runtime.domain import Lease, LeaseKind, RunStatus
from runtime.errors import LeaseLost, NotFound
from runtime.storage.decisions import (
    StoredLease,
    check_lease_kind,
    lease_free,
    lease_holds,
    run_leasable,
)
from runtime.storage.sql_core import Conn, lock_thread
from runtime.storage.sql_rows import Row, lease_from_row
from runtime.storage.sql_threads import run_row


def lease_event(event: str, kind: LeaseKind) -> None:
    telemetry.safe_add(telemetry.LEASE_EVENTS, 1, {"event": event, "kind": kind.value})


async def acquire_run_lease(conn: Conn, run_id: str, owner: str, ttl: float) -> Lease | None:
    thread_id = await conn.fetchval("SELECT thread_id FROM runs WHERE id = $1", run_id)
    if thread_id is None:
        raise NotFound(f"run {run_id} not found")
    # The thread lock orders this against admin leases, stops and resolutions.
    thread = await lock_thread(conn, thread_id)
    run = await conn.fetchrow(
        f"SELECT status, stop_requested{conn.now_column()} FROM runs WHERE id = $1", run_id
    )
    assert run is not None
    conn.take_now(run)
    if not run_leasable(RunStatus(run["status"]), bool(run["stop_requested"])):
        return None
    if await live_lease(conn, LeaseKind.ADMIN, thread_id) is not None:
        return None
    lease = await _grant(conn, LeaseKind.RUN, run_id, thread_id, owner, ttl)
    if lease is not None:
        await _served(conn, str(thread["scope"]))
    return lease


async def _served(conn: Conn, scope: str) -> None:
    """Note that a worker just took a run of `scope`: the round robin's tie-break."""
    await conn.execute(
        "INSERT INTO scope_turns (scope, served_at) VALUES ($1, $2)"
        " ON CONFLICT (scope) DO UPDATE SET served_at = excluded.served_at",
        scope,
        await conn.now(),
    )


async def acquire_admin_lease(conn: Conn, thread_id: str, owner: str, ttl: float) -> Lease | None:
    await lock_thread(conn, thread_id)
    return await _grant(conn, LeaseKind.ADMIN, thread_id, thread_id, owner, ttl)


async def renew_lease(conn: Conn, lease: Lease, ttl: float) -> Lease:
    now = await conn.now()
    # One conditional UPDATE: a concurrent takeover rewrites the row (new token), so whichever
    # commits second sees the other's effect.
    row = await conn.fetchrow(
        "UPDATE leases SET expires_at = $5 WHERE kind = $1 AND resource_id = $2"
        " AND token = $3 AND expires_at > $4 RETURNING *",
        lease.kind.value,
        lease.resource_id,
        lease.token,
        now,
        now + ttl,
    )
    if row is None:
        lease_event("lost", lease.kind)
        raise LeaseLost(
            f"{lease.kind} lease on {lease.resource_id} expired or was taken over",
            token=lease.token,
        )
    conn.on_commit(lambda: lease_event("renewed", lease.kind))
    return lease_from_row(row)


async def release_lease(conn: Conn, lease: Lease) -> None:
    await conn.execute(
        "DELETE FROM leases WHERE kind = $1 AND resource_id = $2 AND token = $3",
        lease.kind.value,
        lease.resource_id,
        lease.token,
    )
    conn.on_commit(lambda: lease_event("released", lease.kind))


async def live_lease(conn: Conn, kind: LeaseKind, resource_id: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM leases WHERE kind = $1 AND resource_id = $2 AND expires_at > $3",
        kind.value,
        resource_id,
        await conn.now(),
    )


async def _grant(
    conn: Conn, kind: LeaseKind, resource_id: str, thread_id: str, owner: str, ttl: float
) -> Lease | None:
    existing = await conn.fetchrow(
        "SELECT expires_at FROM leases WHERE kind = $1 AND resource_id = $2",
        kind.value,
        resource_id,
    )
    now = await conn.now()
    if not lease_free(None if existing is None else float(existing["expires_at"]), now):
        return None
    token = await conn.fetchval(
        "UPDATE fencing_counter SET value = value + 1 WHERE id = 1 RETURNING value"
    )
    row = await conn.fetchrow(
        "INSERT INTO leases (kind, resource_id, thread_id, owner, token, expires_at)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (kind, resource_id) DO UPDATE SET"
        " thread_id = excluded.thread_id, owner = excluded.owner, token = excluded.token,"
        " expires_at = excluded.expires_at RETURNING *",
        kind.value,
        resource_id,
        thread_id,
        owner,
        int(token),
        now + ttl,
    )
    assert row is not None
    event = "taken_over" if existing is not None else "acquired"
    conn.on_commit(lambda: lease_event(event, kind))
    return lease_from_row(row)


async def fence(conn: Conn, lease: Lease, kind: LeaseKind) -> tuple[Row, Row | None]:
    """Lock the lease's thread and check the lease, in the caller's write transaction.

    Returns the locked thread row and, for run leases, the run row. Raises LeaseLost (nothing
    has been written yet) unless the stored lease still holds this token and has not expired
    by the database clock.
    """
    check_lease_kind(lease, kind)
    try:
        thread: Row | None = await lock_thread(conn, lease.thread_id)
    except NotFound:
        thread = None
    # Reads the clock too (after the thread lock, as `now()` would).
    stored = await conn.fetchrow(
        f"SELECT thread_id, token, expires_at{conn.now_column()} FROM leases"
        " WHERE kind = $1 AND resource_id = $2",
        lease.kind.value,
        lease.resource_id,
    )
    conn.take_now(stored)
    held = thread is not None and lease_holds(
        lease,
        None
        if stored is None
        else StoredLease(stored["thread_id"], int(stored["token"]), float(stored["expires_at"])),
        await conn.now(),
    )
    run = None
    if held and kind is LeaseKind.RUN:
        run = await run_row(conn, lease.resource_id, lease.thread_id)
        held = run is not None
    if not held or thread is None:
        lease_event("lost", lease.kind)
        raise LeaseLost(
            f"{lease.kind} lease on {lease.resource_id} expired or was taken over;"
            " nothing was written",
            token=lease.token,
        )
    return thread, run
