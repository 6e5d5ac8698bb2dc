"""Transaction functions of thread retention: idle threads deleted, by a durable timer or a CLI."""

from __future__ import annotations

import logging

from runtime.storage.hooks_store import DueTimer
from runtime.storage.retention import RETENTION_BATCH, RetentionPolicy
from runtime.storage.sql.core import Conn, placeholders
from runtime.storage.sql.threads_tx import ACTIVE_STATUSES
from runtime.storage.sql.timers_tx import TimerOutcome, register_timer_kind, timer_id
from runtime.storage.store import AdmissionLimits

log = logging.getLogger(__name__)

KIND = "retention"

# What keeps a thread however old its last update: work that is live or about to be. Queued
# input and pending actions need no clause of their own: input queues only behind an active
# run, and a pending action is a waiting run's (the store refuses to end one that has any).
_IDLE = (
    f"NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.id AND r.status IN {ACTIVE_STATUSES})"
    " AND NOT EXISTS (SELECT 1 FROM schedules s WHERE s.thread_id = t.id"
    " AND s.status = 'active')"
    " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = t.id AND l.expires_at > $2)"
)


async def expire_threads(conn: Conn, updated_before: float, limit: int) -> list[str]:
    """Delete up to `limit` idle threads last updated before `updated_before` (database
    clock), oldest first, with what belongs to them; their ids.

    On Postgres the rows are locked and skipped when another transaction holds them: a send
    or commit that holds one bumps `updated_at`, and the recheck in the DELETE keeps it."""
    lock = " FOR UPDATE SKIP LOCKED" if conn.dialect.thread_lock else ""
    rows = await conn.fetch(
        f"SELECT t.id FROM threads t WHERE t.updated_at < $1 AND {_IDLE}"
        f" ORDER BY t.updated_at, t.id LIMIT $3{lock}",
        updated_before,
        await conn.now(),
        max(1, int(limit)),
    )
    ids = [str(row["id"]) for row in rows]
    if not ids:
        return []
    marks = placeholders(1, len(ids))
    # Rows keyed by thread without a foreign key; the rest cascades from `threads`.
    await conn.execute(f"DELETE FROM message_actions WHERE thread_id IN ({marks})", *ids)
    await conn.execute(f"DELETE FROM leases WHERE thread_id IN ({marks})", *ids)
    deleted = await conn.fetch(
        f"DELETE FROM threads WHERE id IN ({placeholders(2, len(ids))}) AND updated_at < $1"
        " RETURNING id",
        updated_before,
        *ids,
    )
    return sorted(str(row["id"]) for row in deleted)


async def set_policy(conn: Conn, policy: RetentionPolicy | None) -> None:
    """The deployment's one retention timer for `policy` (None: none). Kept where it is when
    it exists already, so workers starting with the same policy never postpone the job; due
    now when new; a timer of another policy goes."""
    keep = timer_id(KIND, policy.ref) if policy is not None else ""
    await conn.execute("DELETE FROM timers WHERE kind = $1 AND id <> $2", KIND, keep)
    if policy is not None:
        await conn.execute(
            "INSERT INTO timers (id, kind, ref, due_at) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (id) DO NOTHING",
            keep,
            KIND,
            policy.ref,
            await conn.now(),
        )


class RetentionTimer:
    """The durable timer of retention: one row for the deployment, fired by whichever worker
    claims it, so the job runs once per interval however many workers there are."""

    name = KIND

    async def fire(
        self, conn: Conn, timer: DueTimer, limits: AdmissionLimits | None
    ) -> TimerOutcome:
        policy = RetentionPolicy.of_ref(timer.ref)
        now = await conn.now()
        deleted = await expire_threads(conn, now - policy.idle_for, RETENTION_BATCH)
        if deleted:
            log.info("retention deleted %d threads idle over %ss", len(deleted), policy.idle_for)
        # A full batch: more may be due, so at once again (a fresh transaction each time).
        full = len(deleted) >= RETENTION_BATCH
        return TimerOutcome(next_due=now if full else now + policy.interval)


register_timer_kind(RetentionTimer())

__all__ = ["KIND", "RetentionTimer", "expire_threads", "set_policy"]
