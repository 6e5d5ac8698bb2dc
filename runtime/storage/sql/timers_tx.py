"""Transaction functions for durable timers: claimed with a fencing token, fired once by kind."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from runtime.storage.hooks_store import DueTimer, FireResult
from runtime.storage.sql.core import Conn
from runtime.storage.store import AdmissionLimits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimerOutcome:
    """What a kind's `fire` did in the timer's transaction: when the timer is due next (None:
    it is deleted), and the thread and run to publish for once it committed."""

    next_due: float | None
    thread_id: str | None = None
    version: int | None = None
    run_id: str | None = None
    stop_run_id: str | None = None  # a run the fire's input interrupts


class TimerKind(Protocol):
    """What a timer does when due. `fire` runs inside the transaction that checked the fencing
    token and moves or deletes the timer, so its writes commit exactly when the fire does."""

    name: str

    async def fire(
        self, conn: Conn, timer: DueTimer, limits: AdmissionLimits | None
    ) -> TimerOutcome: ...


TIMER_KINDS: dict[str, TimerKind] = {}


def register_timer_kind(kind: TimerKind) -> TimerKind:
    """Make `kind` fireable by every worker of this process (schedules, approval deadlines and
    thread retention register here, each under its name; a later registration replaces it)."""
    TIMER_KINDS[kind.name] = kind
    return kind


def timer_id(kind: str, ref: str) -> str:
    return f"{kind}:{ref}"


def _skip_locked(conn: Conn) -> str:
    # Where rows lock (Postgres), workers claiming at once take different timers instead of
    # queueing behind each other; SQLite's write transaction serialises claims anyway.
    return " FOR UPDATE SKIP LOCKED" if conn.dialect.thread_lock else ""


async def next_token(conn: Conn) -> int:
    """A fresh fencing token from the counter the run and admin leases use."""
    value = await conn.fetchval(
        "UPDATE fencing_counter SET value = value + 1 WHERE id = 1 RETURNING value"
    )
    return int(value)


async def set_timer(conn: Conn, kind: str, ref: str, due_at: float) -> None:
    """Create the timer of (`kind`, `ref`) or move it to `due_at`, dropping any lease (a fire
    in flight then finds its token gone and commits nothing)."""
    await conn.execute(
        "INSERT INTO timers (id, kind, ref, due_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (id) DO UPDATE SET due_at = excluded.due_at, owner = NULL, token = NULL,"
        " lease_until = NULL",
        timer_id(kind, ref),
        kind,
        ref,
        due_at,
    )


async def delete_timer(conn: Conn, kind: str, ref: str) -> None:
    await conn.execute("DELETE FROM timers WHERE id = $1", timer_id(kind, ref))


def _due(now: str) -> str:
    """The timers due at `now` (SQL) with their lease free or expired: what `any_due` asks for
    and `claim` leases."""
    return f"FROM timers WHERE due_at <= {now} AND (lease_until IS NULL OR lease_until <= {now})"


async def any_due(conn: Conn) -> bool:
    """Whether some timer is due with its lease free: one statement, on the database clock, for
    the loop to ask before the write transaction that claims (idle, the common case, writes
    nothing)."""
    now, args = conn.now_expression(1)
    return await conn.fetchrow(f"SELECT 1 AS due {_due(now)} LIMIT 1", *args) is not None


async def claim(conn: Conn, owner: str, ttl: float, limit: int) -> list[DueTimer]:
    """Lease up to `limit` due timers whose lease is free or expired, oldest due first."""
    now = await conn.now()
    rows = await conn.fetch(
        f"SELECT id, kind, ref, due_at {_due('$1')} ORDER BY due_at LIMIT $2" + _skip_locked(conn),
        now,
        limit,
    )
    claimed = []
    for row in rows:
        token = await next_token(conn)
        await conn.execute(
            "UPDATE timers SET owner = $2, token = $3, lease_until = $4 WHERE id = $1",
            row["id"],
            owner,
            token,
            now + ttl,
        )
        claimed.append(
            DueTimer(
                id=row["id"],
                kind=row["kind"],
                ref=row["ref"],
                due_at=float(row["due_at"]),
                token=token,
            )
        )
    return claimed


async def fire(conn: Conn, timer: DueTimer, limits: AdmissionLimits | None) -> FireResult:
    """Fire a claimed timer: nothing unless its token still holds (another worker claimed it
    after this lease expired, or the timer was moved or deleted); else its kind's writes and
    the timer's move or deletion, in this one transaction."""
    lock = " FOR UPDATE" if conn.dialect.thread_lock else ""
    row = await conn.fetchrow(
        f"SELECT id FROM timers WHERE id = $1 AND token = $2{lock}", timer.id, timer.token
    )
    if row is None:
        return FireResult(timer_id=timer.id, fired=False)
    kind = TIMER_KINDS.get(timer.kind)
    if kind is None:
        # Written by a newer version of the code: its lease expires and a worker that knows
        # the kind fires it.
        log.warning("timer %s has unknown kind %r", timer.id, timer.kind)
        return FireResult(timer_id=timer.id, fired=False)
    outcome = await kind.fire(conn, timer, limits)
    if outcome.next_due is None:
        await conn.execute("DELETE FROM timers WHERE id = $1", timer.id)
    else:
        await conn.execute(
            "UPDATE timers SET due_at = $2, owner = NULL, token = NULL, lease_until = NULL"
            " WHERE id = $1",
            timer.id,
            outcome.next_due,
        )
    return FireResult(
        timer_id=timer.id,
        fired=True,
        thread_id=outcome.thread_id,
        version=outcome.version,
        run_id=outcome.run_id,
        stop_run_id=outcome.stop_run_id,
    )


__all__ = [
    "TIMER_KINDS",
    "TimerKind",
    "TimerOutcome",
    "claim",
    "delete_timer",
    "fire",
    "next_token",
    "register_timer_kind",
    "set_timer",
    "timer_id",
]
