"""Transaction functions for schedules: their rows, and the timer kind whose fire admits a run."""

from __future__ import annotations

from collections.abc import Collection

from runtime.domain import Admission, InputPolicy
from runtime.errors import Conflict, NotFound, QuotaExceeded, RunActive
from runtime.storage.hooks_store import (
    DueTimer,
    MissedFire,
    Schedule,
    ScheduleFire,
    ScheduleSpec,
    ScheduleStatus,
)
from runtime.storage.schedule_rules import plan_fire
from runtime.storage.sql import queue_tx, threads_tx
from runtime.storage.sql.core import Conn, after_clause, scope_clause
from runtime.storage.sql.rows import Row, encode_client_tools, encode_metadata, new_id
from runtime.storage.sql.timers_tx import TimerOutcome, delete_timer, register_timer_kind, set_timer
from runtime.storage.store import AdmissionLimits
from runtime.storage.thread_query import read_cursor

KIND = "schedule"


def schedule_from_row(row: Row) -> Schedule:
    return Schedule(
        id=row["id"],
        scope=row["scope"],
        thread_id=row["thread_id"],
        new_thread=bool(row["new_thread"]),
        title=row["title"],
        cron=row["cron"],
        timezone=row["timezone"],
        run_at=row["run_at"],
        text=row["text"],
        policy=InputPolicy(row["policy"]),
        missed=MissedFire(row["missed"]),
        misfire_grace=float(row["misfire_grace"]),
        status=ScheduleStatus(row["status"]),
        created_by=row["created_by"],
        next_fire_at=row["next_fire_at"],
        last_fire_at=row["last_fire_at"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


async def create(
    conn: Conn, spec: ScheduleSpec, created_by: str, first: float, per_scope: int | None
) -> Schedule:
    if per_scope is not None:
        count = await conn.fetchval("SELECT COUNT(*) FROM schedules WHERE scope = $1", spec.scope)
        if int(count) >= per_scope:
            raise Conflict(f"scope {spec.scope} has {per_scope} schedules, the most it may have")
    schedule_id = new_id("sch")
    now = await conn.now()
    row = await conn.fetchrow(
        "INSERT INTO schedules (id, scope, thread_id, new_thread, title, cron, timezone, run_at,"
        " text, policy, missed, misfire_grace, status, created_by, next_fire_at, last_fire_at,"
        " created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,"
        " 'active', $13, $14, NULL, $15, $15) RETURNING *",
        schedule_id,
        spec.scope,
        spec.thread_id,
        spec.new_thread,
        spec.title,
        spec.cron,
        spec.timezone,
        spec.run_at,
        spec.text,
        spec.policy.value,
        spec.missed.value,
        spec.misfire_grace,
        created_by,
        first,
        now,
    )
    assert row is not None
    await set_timer(conn, KIND, schedule_id, first)
    return schedule_from_row(row)


async def get(conn: Conn, scopes: Collection[str], schedule_id: str, *, lock: bool = False) -> Row:
    clause, values = scope_clause("scope", scopes, 2)
    suffix = " FOR UPDATE" if lock and conn.dialect.thread_lock else ""
    row = await conn.fetchrow(
        f"SELECT * FROM schedules WHERE id = $1 AND {clause}{suffix}", schedule_id, *values
    )
    if row is None:
        raise NotFound(f"schedule {schedule_id} not found")
    return row


async def list_schedules(
    conn: Conn, scopes: Collection[str], limit: int, after: str | None = None
) -> list[Schedule]:
    """Oldest first, then by id; `after` (a `created_cursor`) pages on."""
    clause, args = scope_clause("scope", scopes, 2)
    args = [limit, *args]
    page = after_clause(args, after, "created_at", "id")
    rows = await conn.fetch(
        f"SELECT * FROM schedules WHERE {clause}{page} ORDER BY created_at, id LIMIT $1", *args
    )
    return [schedule_from_row(row) for row in rows]


async def set_paused(
    conn: Conn, scopes: Collection[str], schedule_id: str, paused: bool, resume_at: float | None
) -> Schedule:
    """Pause (the timer goes) or resume (the timer comes back at `resume_at`: the next fire
    from now, so a pause is never a backlog of missed fires)."""
    row = await get(conn, scopes, schedule_id, lock=True)
    status = ScheduleStatus(row["status"])
    if status is ScheduleStatus.DONE:
        raise Conflict(f"schedule {schedule_id} fired already and is done")
    now = await conn.now()
    if paused:
        await delete_timer(conn, KIND, schedule_id)
        next_fire = None
    else:
        next_fire = resume_at if status is ScheduleStatus.PAUSED else row["next_fire_at"]
        if next_fire is not None:
            await set_timer(conn, KIND, schedule_id, float(next_fire))
    updated = await conn.fetchrow(
        "UPDATE schedules SET status = $2, next_fire_at = $3, updated_at = $4 WHERE id = $1"
        " RETURNING *",
        schedule_id,
        (ScheduleStatus.PAUSED if paused else ScheduleStatus.ACTIVE).value,
        next_fire,
        now,
    )
    assert updated is not None
    return schedule_from_row(updated)


async def delete(conn: Conn, scopes: Collection[str], schedule_id: str) -> None:
    await get(conn, scopes, schedule_id, lock=True)
    await delete_timer(conn, KIND, schedule_id)
    await conn.execute("DELETE FROM schedules WHERE id = $1", schedule_id)


async def fires(
    conn: Conn, scopes: Collection[str], schedule_id: str, limit: int, after: str | None = None
) -> list[ScheduleFire]:
    """Newest fire first (one per fire time); `after` (a `fire_cursor`) pages on."""
    await get(conn, scopes, schedule_id)
    older = ""
    args: list[object] = [schedule_id, limit]
    if after is not None:
        args.append(read_cursor(after).at)
        older = " AND fire_at < $3"
    rows = await conn.fetch(
        f"SELECT * FROM schedule_fires WHERE schedule_id = $1{older}"
        " ORDER BY fire_at DESC LIMIT $2",
        *args,
    )
    return [ScheduleFire(**{**row, "fire_at": float(row["fire_at"])}) for row in rows]


def fire_key(schedule_id: str, fire_at: float) -> str:
    """The admission's idempotency key: one per schedule and fire time."""
    return f"schedule:{schedule_id}:{fire_at:.3f}"


async def _admit(
    conn: Conn, row: Row, fire_at: float, limits: AdmissionLimits | None
) -> tuple[str, Admission | None, str | None]:
    """Send the schedule's input for `fire_at`: (outcome, admission, detail). A refusal (busy
    thread under `reject`, a quota, a deleted thread) is recorded, not raised: the fire still
    happened and the schedule moves on."""
    scope = str(row["scope"])
    thread_id = row["thread_id"]
    try:
        if row["new_thread"]:
            thread_id = new_id("th")
            await threads_tx.create_thread(
                conn,
                thread_id,
                scope,
                row["title"],
                encode_metadata({"schedule_id": row["id"]}, "metadata"),
                encode_metadata(None, "private_metadata"),
            )
        admission = await queue_tx.submit_input(
            conn,
            thread_id,
            [scope],
            text=row["text"],
            submitted_by=f"schedule:{row['id']}",
            client_request_id=fire_key(row["id"], fire_at),
            policy=InputPolicy(row["policy"]),
            tools_json=encode_client_tools(()),
            limits=limits,
        )
    except RunActive as exc:
        return "refused_busy", None, exc.message
    except QuotaExceeded as exc:
        return "refused_quota", None, exc.message
    except NotFound as exc:
        return "refused_missing", None, exc.message
    return ("admitted" if admission.run_id else "queued"), admission, None


class ScheduleTimer:
    """The timer kind of schedules: one fire per due time, keyed by (schedule, fire time)."""

    name = KIND

    async def fire(
        self, conn: Conn, timer: DueTimer, limits: AdmissionLimits | None
    ) -> TimerOutcome:
        lock = " FOR UPDATE" if conn.dialect.thread_lock else ""
        row = await conn.fetchrow(f"SELECT * FROM schedules WHERE id = $1{lock}", timer.ref)
        if row is None or row["status"] != ScheduleStatus.ACTIVE:
            return TimerOutcome(next_due=None)
        now = await conn.now()
        plan = plan_fire(
            cron=row["cron"],
            timezone=row["timezone"],
            due=timer.due_at,
            now=now,
            grace=float(row["misfire_grace"]),
            missed=MissedFire(row["missed"]),
        )
        done = await conn.fetchval(
            "SELECT 1 FROM schedule_fires WHERE schedule_id = $1 AND fire_at = $2",
            timer.ref,
            timer.due_at,
        )
        outcome, admission, detail = "skipped_missed", None, None
        if done:
            outcome = "duplicate"  # fired already (the timer was moved back): nothing twice
        elif plan.admit:
            outcome, admission, detail = await _admit(conn, row, timer.due_at, limits)
            if plan.missed:
                detail = "missed; run once on recovery"
        if not done:
            await conn.execute(
                "INSERT INTO schedule_fires (schedule_id, fire_at, fired_at, outcome, thread_id,"
                " run_id, queued_item_id, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                timer.ref,
                timer.due_at,
                now,
                outcome,
                admission.thread_id if admission else None,
                admission.run_id if admission else None,
                admission.queued_item_id if admission else None,
                detail,
            )
        status = ScheduleStatus.ACTIVE if plan.next_due is not None else ScheduleStatus.DONE
        await conn.execute(
            "UPDATE schedules SET last_fire_at = $2, next_fire_at = $3, status = $4,"
            " updated_at = $5 WHERE id = $1",
            timer.ref,
            timer.due_at,
            plan.next_due,
            status.value,
            now,
        )
        fresh = admission is not None and not admission.duplicate
        return TimerOutcome(
            next_due=plan.next_due,
            thread_id=admission.thread_id if fresh and admission else None,
            version=admission.version if fresh and admission else None,
            run_id=admission.run_id if fresh and admission else None,
            stop_run_id=admission.interrupted_run_id if fresh and admission else None,
        )


register_timer_kind(ScheduleTimer())

__all__ = ["KIND", "ScheduleTimer", "create", "fire_key", "schedule_from_row"]
