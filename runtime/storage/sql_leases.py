"""Run and admin leases on the database clock, fencing tokens, and the fence for runtime writes."""

from __future__ import annotations

import math

from runtime import telemetry
from runtime.errors import InvalidInput, LeaseLost, NotFound
from runtime.models import Lease, LeaseKind, RunStatus
from runtime.storage.sql_core import Conn
from runtime.storage.sql_queue import QueueOps
from runtime.storage.sql_rows import Row, lease_from_row


def _lease_event(event: str, kind: LeaseKind) -> None:
    telemetry.safe_add(telemetry.LEASE_EVENTS, 1, {"event": event, "kind": kind.value})


def _check_ttl(ttl: float) -> float:
    if not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidInput("lease ttl must be a positive number of seconds")
    return float(ttl)


def _check_owner(owner: str) -> str:
    if not isinstance(owner, str) or not owner:
        raise InvalidInput("lease owner must be a non-empty string")
    return owner


class LeaseOps(QueueOps):
    """Exclusive expiring ownership; every acquisition takes a fresh fencing token."""

    async def acquire_run_lease(self, run_id: str, owner: str, ttl: float) -> Lease | None:
        ttl = _check_ttl(ttl)
        owner = _check_owner(owner)

        async def tx(conn: Conn) -> Lease | None:
            thread_id = await conn.fetchval("SELECT thread_id FROM runs WHERE id = $1", run_id)
            if thread_id is None:
                raise NotFound(f"run {run_id} not found")
            # The thread lock orders this against admin leases, stops and resolutions.
            await self._lock_thread(conn, thread_id)
            run = await conn.fetchrow(
                "SELECT status, stop_requested FROM runs WHERE id = $1", run_id
            )
            assert run is not None
            status = RunStatus(run["status"])
            if status.is_terminal or (status is RunStatus.WAITING and not run["stop_requested"]):
                return None
            if await self._live_lease(conn, LeaseKind.ADMIN, thread_id) is not None:
                return None
            return await self._grant(conn, LeaseKind.RUN, run_id, thread_id, owner, ttl)

        lease = await self._write(tx)
        if lease is None:
            _lease_event("busy", LeaseKind.RUN)
        return lease

    async def acquire_admin_lease(self, thread_id: str, owner: str, ttl: float) -> Lease | None:
        ttl = _check_ttl(ttl)
        owner = _check_owner(owner)

        async def tx(conn: Conn) -> Lease | None:
            await self._lock_thread(conn, thread_id)
            return await self._grant(conn, LeaseKind.ADMIN, thread_id, thread_id, owner, ttl)

        lease = await self._write(tx)
        if lease is None:
            _lease_event("busy", LeaseKind.ADMIN)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        ttl = _check_ttl(ttl)

        async def tx(conn: Conn) -> Lease:
            now = await conn.now()
            # One conditional UPDATE: a concurrent takeover rewrites the row (new token), so
            # whichever commits second sees the other's effect.
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
                _lease_event("lost", lease.kind)
                raise LeaseLost(
                    f"{lease.kind} lease on {lease.resource_id} expired or was taken over",
                    token=lease.token,
                )
            conn.on_commit(lambda: _lease_event("renewed", lease.kind))
            return lease_from_row(row)

        return await self._write(tx)

    async def release_lease(self, lease: Lease) -> None:
        async def tx(conn: Conn) -> None:
            await conn.execute(
                "DELETE FROM leases WHERE kind = $1 AND resource_id = $2 AND token = $3",
                lease.kind.value,
                lease.resource_id,
                lease.token,
            )
            conn.on_commit(lambda: _lease_event("released", lease.kind))

        await self._write(tx)

    # --- helpers inside a locked write transaction --------------------------------------

    async def _live_lease(self, conn: Conn, kind: LeaseKind, resource_id: str) -> Row | None:
        return await conn.fetchrow(
            "SELECT * FROM leases WHERE kind = $1 AND resource_id = $2 AND expires_at > $3",
            kind.value,
            resource_id,
            await conn.now(),
        )

    async def _grant(
        self,
        conn: Conn,
        kind: LeaseKind,
        resource_id: str,
        thread_id: str,
        owner: str,
        ttl: float,
    ) -> Lease | None:
        existing = await conn.fetchrow(
            "SELECT expires_at FROM leases WHERE kind = $1 AND resource_id = $2",
            kind.value,
            resource_id,
        )
        now = await conn.now()
        if existing is not None and float(existing["expires_at"]) > now:
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
        conn.on_commit(lambda: _lease_event(event, kind))
        return lease_from_row(row)

    async def _fence(self, conn: Conn, lease: Lease, kind: LeaseKind) -> tuple[Row, Row | None]:
        """Lock the lease's thread and check the lease, in the caller's write transaction.

        Returns the locked thread row and, for run leases, the run row. Raises LeaseLost
        (nothing has been written yet) unless the stored lease still holds this token and
        has not expired by the database clock.
        """
        if lease.kind is not kind:
            raise InvalidInput(f"this write needs a {kind} lease, not a {lease.kind} lease")
        try:
            thread = await self._lock_thread(conn, lease.thread_id)
        except NotFound:
            thread = None
        stored = await conn.fetchrow(
            "SELECT thread_id, token, expires_at FROM leases WHERE kind = $1 AND resource_id = $2",
            lease.kind.value,
            lease.resource_id,
        )
        now = await conn.now()
        run = None
        valid = (
            thread is not None
            and stored is not None
            and int(stored["token"]) == lease.token
            and stored["thread_id"] == lease.thread_id
            and float(stored["expires_at"]) > now
        )
        if valid and kind is LeaseKind.RUN:
            run = await self._run_row(conn, lease.resource_id, lease.thread_id)
            valid = run is not None
        if valid and kind is LeaseKind.ADMIN:
            valid = lease.resource_id == lease.thread_id
        if not valid or thread is None:
            _lease_event("lost", lease.kind)
            raise LeaseLost(
                f"{lease.kind} lease on {lease.resource_id} expired or was taken over;"
                " nothing was written",
                token=lease.token,
            )
        return thread, run
