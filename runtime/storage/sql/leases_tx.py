"""Transaction functions for leases on the database clock, and the fence of every runtime write."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from runtime import instruments
from runtime.domain import Lease, LeaseKind, RunStatus
from runtime.errors import LeaseLost, NotFound
from runtime.storage.decisions import (
    StoredLease,
    check_lease_kind,
    lease_free,
    lease_holds,
    run_leasable,
)
from runtime.storage.sql.core import NOW_COLUMN, Conn, lock_thread, prelocked
from runtime.storage.sql.rows import (
    Row,
    lease_from_row,
    loads,
    message_from_row,
    run_from_row,
    thread_from_row,
)
from runtime.storage.sql.threads_tx import (
    FIRST_QUEUED,
    TAIL,
    THREAD,
    Prefixed,
    first_queued_join,
    tail_join,
)
from runtime.storage.store import HistoryRead, RunLeaseRenewal, RunStart, StartedRun


def lease_event(event: str, kind: LeaseKind, count: int = 1) -> None:
    instruments.safe_add(instruments.LEASE_EVENTS, count, {"event": event, "kind": kind.value})


async def acquire_run_lease(conn: Conn, run_id: str, owner: str, ttl: float) -> Lease | None:
    # The thread lock orders this against admin leases, stops and resolutions. The run's
    # thread is found in the same statement: a run never changes threads, so the subquery's
    # snapshot (taken before any wait for the lock) cannot be stale.
    thread = await conn.fetchrow(
        "SELECT * FROM threads WHERE id = (SELECT thread_id FROM runs WHERE id = $1)"
        + conn.dialect.thread_lock,
        run_id,
    )
    if thread is None:
        raise NotFound(f"run {run_id} not found")
    thread_id = str(thread["id"])
    # One statement after the lock: the run, the clock, the thread's admin lease and the run's
    # lease (every one of them written only under the thread lock).
    run = await conn.fetchrow(
        "SELECT r.status, r.stop_requested, admin.expires_at AS admin_expires_,"
        f" held.expires_at AS held_expires_{conn.now_column()} FROM runs r"
        " LEFT JOIN leases admin ON admin.kind = 'admin' AND admin.resource_id = r.thread_id"
        " LEFT JOIN leases held ON held.kind = 'run' AND held.resource_id = r.id"
        " WHERE r.id = $1",
        run_id,
    )
    assert run is not None
    conn.take_now(run)
    if not run_leasable(RunStatus(run["status"]), bool(run["stop_requested"])):
        return None
    now = await conn.now()
    if not lease_free(_expiry(run["admin_expires_"]), now):
        return None  # a live admin lease (a history rewrite) holds the thread
    return await _grant(
        conn,
        LeaseKind.RUN,
        run_id,
        thread_id,
        owner,
        ttl,
        (run["held_expires_"] is not None, _expiry(run["held_expires_"])),
        served=str(thread["scope"]),
    )


async def acquire_run_lease_call(
    conn: Conn, key: str, run_id: str, owner: str, ttl: float
) -> Lease | None:
    """`acquire_run_lease` as one statement: the dialect's `run_lease_function`, which claims
    `key` (as `SqlTransactions._run` would), locks the thread, decides and grants like the
    statements above, in the statement's own transaction. Run again after an unknown outcome
    it finds `key` claimed and answers the lease that attempt granted this owner, if it is
    still live (else None, as for a busy run)."""
    function = conn.dialect.run_lease_function
    assert function is not None
    row = await _granted(conn, function, run_id, key, run_id, owner, float(ttl))
    return None if row is None else lease_from_row(row)


async def _granted(conn: Conn, function: str, run_id: str, *args: Any) -> Row | None:
    """The row of a run lease function called with `args`, when it holds a lease (None: none
    was granted, as for a busy run), the grant counted once committed; `NotFound` when the
    function found no run `run_id`."""
    placeholders = ", ".join(f"${n}" for n in range(1, len(args) + 1))
    try:
        row = await conn.fetchrow(f"SELECT * FROM {function}({placeholders})", *args)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == "P0002":  # no_data_found: the run does not exist
            raise NotFound(f"run {run_id} not found") from None
        raise
    assert row is not None
    if row["token"] is None:
        return None
    event = "taken_over" if row["taken_over"] else "acquired"
    conn.on_commit(lambda: lease_event(event, LeaseKind.RUN))
    return row


async def start_run_call(
    conn: Conn,
    key: str,
    run_id: str,
    owner: str,
    ttl: float,
    history: tuple[str, int] | None = None,
) -> RunStart | None:
    """`Store.start_run` as one statement: the dialect's `start_run_function`, which grants as
    `acquire_run_lease_call` does (its key claimed first, its replay alike) and starts the
    episode under the lock the grant took; with `history` (thread, from position), the
    thread's messages from there on are read after the start. A replay (after an unknown
    outcome) gets the run as it was before the start back from the key's row, and the run and
    thread as they are now (only this lease's holder has changed them since)."""
    function = conn.dialect.start_run_function
    assert function is not None
    thread_id, history_from = history if history is not None else (None, 0)
    row = await _granted(
        conn, function, run_id, key, run_id, owner, float(ttl), thread_id, history_from
    )
    if row is None:
        return None
    lease = lease_from_row(row)
    if row["before_run"] is None or row["run"] is None or row["thread"] is None:
        return RunStart(lease=lease)  # e.g. a replay after the thread was deleted: fenced later
    thread = loads(row["thread"])
    scope = {"scope": thread["scope"]}
    messages = row["messages"]
    return RunStart(
        lease=lease,
        started=StartedRun(
            before=run_from_row({**loads(row["before_run"]), **scope}),
            run=run_from_row({**loads(row["run"]), **scope}),
            version=int(thread["version"]),
            thread=thread_from_row(thread),
        ),
        history=None
        if messages is None
        else HistoryRead(
            epoch=int(thread["history_epoch"]),
            messages=tuple(message_from_row(message) for message in loads(messages)),
        ),
    )


def _expiry(value: Any) -> float | None:
    return None if value is None else float(value)


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


# Leases per renewal statement: two parameters each, far below either backend's bound.
RENEWALS_PER_STATEMENT = 500


async def renew_run_leases(
    conn: Conn, leases: Sequence[Lease], ttl: float
) -> dict[tuple[str, int], tuple[Lease, bool]]:
    """`renew_lease` for up to `RENEWALS_PER_STATEMENT` run leases in one statement on the
    database clock, each row matched by its own token (a takeover's lease is never extended),
    returning with each renewed lease whether its run was asked to stop or cancelled.

    One statement, run in autocommit (`SqlStore.renew_run_leases`): its row locks last only
    while it executes, so a worker frozen (SIGSTOP, a GC pause) mid-renewal never holds a lease
    row that a takeover must wait for, as a transaction open across round trips would."""
    now = conn.dialect.now_sql
    matches = " OR ".join(
        f"(resource_id = ${2 + 2 * i} AND token = ${3 + 2 * i})" for i in range(len(leases))
    )
    rows = await conn.fetch(
        f"UPDATE leases SET expires_at = {now} + $1 WHERE kind = 'run' AND expires_at > {now}"
        f" AND ({matches}) RETURNING *, (SELECT CASE WHEN r.stop_requested = TRUE"
        " OR r.status = 'cancelled' THEN 1 ELSE 0 END FROM runs r"
        " WHERE r.id = leases.resource_id) AS stop_",
        ttl,
        *[value for lease in leases for value in (lease.resource_id, lease.token)],
    )
    renewed: dict[tuple[str, int], tuple[Lease, bool]] = {}
    for row in rows:
        lease = lease_from_row(row)
        renewed[(lease.resource_id, lease.token)] = (lease, bool(row["stop_"]))
    count = len(renewed)
    conn.on_commit(lambda: lease_event("renewed", LeaseKind.RUN, count))
    return renewed


def renewal_answers(
    leases: Sequence[Lease], renewed: dict[tuple[str, int], tuple[Lease, bool]]
) -> list[RunLeaseRenewal]:
    """`renew_run_leases`' rows as the answers in the leases' order (a lease not among them was
    lost: expired, released or taken over)."""
    answers: list[RunLeaseRenewal] = []
    for lease in leases:
        held = renewed.get((lease.resource_id, lease.token))
        if held is None:
            lease_event("lost", lease.kind)
            answers.append(RunLeaseRenewal(None, False))
        else:
            answers.append(RunLeaseRenewal(*held))
    return answers


_RELEASE = "DELETE FROM leases WHERE kind = $1 AND resource_id = $2 AND token = $3"


async def release_lease(conn: Conn, lease: Lease) -> None:
    await conn.execute(_RELEASE, lease.kind.value, lease.resource_id, lease.token)
    conn.on_commit(lambda: lease_event("released", lease.kind))


async def release_with_commit(conn: Conn, lease: Lease) -> None:
    """`release_lease` inside a fenced write transaction, after its fence: the DELETE is held
    (`Conn.execute_later`) and goes with the transaction's other writes and COMMIT, so ending
    a run costs no separate round trip. A retry after an unknown outcome replays the commit
    (`SqlTransactions._run`), whose transaction deleted the row."""
    await conn.execute_later(_RELEASE, lease.kind.value, lease.resource_id, lease.token)
    conn.on_commit(lambda: lease_event("released", lease.kind))


async def live_lease(conn: Conn, kind: LeaseKind, resource_id: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM leases WHERE kind = $1 AND resource_id = $2 AND expires_at > $3",
        kind.value,
        resource_id,
        await conn.now(),
    )


async def _grant(
    conn: Conn,
    kind: LeaseKind,
    resource_id: str,
    thread_id: str,
    owner: str,
    ttl: float,
    existing: tuple[bool, float | None] | None = None,
    *,
    served: str | None = None,
) -> Lease | None:
    """Grant the lease unless a live one holds the resource. `existing`: (a lease row exists,
    its expiry) when the caller read it already. `served`: the scope to note in `scope_turns`
    (a worker just took a run of it: the round robin's tie-break)."""
    if existing is None:
        row = await conn.fetchrow(
            "SELECT expires_at FROM leases WHERE kind = $1 AND resource_id = $2",
            kind.value,
            resource_id,
        )
        existing = (row is not None, None if row is None else float(row["expires_at"]))
    now = await conn.now()
    if not lease_free(existing[1], now):
        return None
    args: list[Any] = [kind.value, resource_id, thread_id, owner, now + ttl]
    upsert = (
        " ON CONFLICT (kind, resource_id) DO UPDATE SET"
        " thread_id = excluded.thread_id, owner = excluded.owner, token = excluded.token,"
        " expires_at = excluded.expires_at RETURNING *"
    )
    if conn.dialect.writing_ctes:
        # One statement: the next fencing token, the lease and the scope's turn.
        turn = ""
        if served is not None:
            turn = (
                ", turn AS (INSERT INTO scope_turns (scope, served_at) VALUES ($6, $7)"
                " ON CONFLICT (scope) DO UPDATE SET served_at = excluded.served_at)"
            )
            args += [served, now]
        row = await conn.fetchrow(
            "WITH token AS (UPDATE fencing_counter SET value = value + 1 WHERE id = 1"
            f" RETURNING value){turn}"
            " INSERT INTO leases (kind, resource_id, thread_id, owner, token, expires_at)"
            " SELECT $1::text, $2::text, $3::text, $4::text, token.value,"
            f" $5::double precision FROM token{upsert}",
            *args,
        )
    else:
        token = await conn.fetchval(
            "UPDATE fencing_counter SET value = value + 1 WHERE id = 1 RETURNING value"
        )
        row = await conn.fetchrow(
            "INSERT INTO leases (kind, resource_id, thread_id, owner, token, expires_at)"
            f" VALUES ($1, $2, $3, $4, $6, $5){upsert}",
            *args,
            int(token),
        )
        if served is not None:
            await conn.execute(
                "INSERT INTO scope_turns (scope, served_at) VALUES ($1, $2)"
                " ON CONFLICT (scope) DO UPDATE SET served_at = excluded.served_at",
                served,
                now,
            )
    assert row is not None
    event = "taken_over" if existing[0] else "acquired"
    conn.on_commit(lambda: lease_event(event, kind))
    return lease_from_row(row)


# The thread's messages from a position on (alias `h`), one per row of the fence's statement
# (`fence(history_from=…)`: what `threads_tx.read_history` reads).
HISTORY = Prefixed("h", "history_", TAIL.columns)

# Columns of the fence's statement that are not the run's.
_NOT_RUN = ("lease_", THREAD.prefix, TAIL.prefix, FIRST_QUEUED.prefix, HISTORY.prefix, NOW_COLUMN)


@functools.lru_cache(maxsize=64)
def _run_columns(columns: tuple[str, ...]) -> tuple[str, ...]:
    """The run's own columns among a fence statement's (found once per statement shape)."""
    return tuple(c for c in columns if not c.startswith(_NOT_RUN))


@dataclass(frozen=True)
class Fenced:
    """What `fence` read under the thread lock: the thread row, the run row (run leases) and,
    when asked for, the thread's tail message row (`tail_read`; `tail` None: no message)."""

    thread: Row
    run: Row | None
    tail: Row | None = None
    tail_read: bool = False
    # With `queued`: the thread's first queued item (None: nothing queued).
    queued: Row | Literal["unread"] | None = "unread"
    # With `history_from`: the thread's message rows from that position on, in order.
    history: tuple[Row, ...] = ()


@functools.lru_cache(maxsize=64)
def _fence_sql(run: bool, tail: bool, queued: bool, history: bool, now_column: str) -> str:
    """`fence`'s statement (built once per shape: fences run several times per run)."""
    columns = (
        "l.thread_id AS lease_thread_, l.token AS lease_token_, l.expires_at AS lease_expires_"
        + THREAD.select()
    )
    joins = ""
    if run:
        columns += ", r.*"
        joins += " LEFT JOIN runs r ON r.id = l.resource_id AND r.thread_id = t.id"
    if tail:
        columns += TAIL.select()
        joins += tail_join("t.id")
    if queued:
        columns += FIRST_QUEUED.select()
        joins += first_queued_join("t.id")
    order = ""
    if history:
        columns += HISTORY.select()
        joins += " LEFT JOIN messages h ON h.thread_id = t.id AND h.position >= $4"
        order = " ORDER BY h.position"
    return (
        f"SELECT {columns}{now_column} FROM threads t"
        " LEFT JOIN leases l ON l.kind = $1 AND l.resource_id = $2"
        f"{joins} WHERE t.id = $3{order}"
    )


async def fence(
    conn: Conn,
    lease: Lease,
    kind: LeaseKind,
    *,
    tail: bool = False,
    queued: bool = False,
    history_from: int | None = None,
) -> Fenced:
    """Lock the lease's thread and check the lease, in the caller's write transaction.

    Returns the locked thread row, for run leases the run row, with `tail` the tail message
    row, with `queued` the first queued item's and with `history_from` the message rows from
    that position on (one result row each: meant for a few, a tail read). Raises LeaseLost
    (nothing has been written yet) unless the stored lease still holds this token and has not
    expired by the database clock.

    After the lock, one statement reads the lease, the clock, the run, the tail, the queue and
    the messages: every row it reads is written only under the thread lock, so it sees what
    separate reads would.
    """
    check_lease_kind(lease, kind)
    # The thread row is read by the statement below, after the lock: taken here, or with the
    # transaction's BEGIN (`Conn.locked`), or (SQLite) by the write transaction itself.
    if conn.dialect.thread_lock and not prelocked(conn, lease.thread_id):
        # No row: the statement below finds none either.
        with contextlib.suppress(NotFound):
            await lock_thread(conn, lease.thread_id)
    # Reads the clock too (after the thread lock, as `now()` would).
    sql = _fence_sql(
        kind is LeaseKind.RUN, tail, queued, history_from is not None, conn.now_column()
    )
    args: list[Any] = [lease.kind.value, lease.resource_id, lease.thread_id]
    rows: list[Row] = []
    if history_from is None:
        found = await conn.fetchrow(sql, *args)
    else:
        rows = await conn.fetch(sql, *args, int(history_from))
        found = rows[0] if rows else None
    thread: Row | None = None if found is None else THREAD.row(found)
    # The lease's columns (all NULL: no lease row).
    stored = None if found is None or found["lease_token_"] is None else found
    conn.take_now(found)
    held = thread is not None and lease_holds(
        lease,
        None
        if stored is None
        else StoredLease(
            stored["lease_thread_"], int(stored["lease_token_"]), float(stored["lease_expires_"])
        ),
        await conn.now(),
    )
    run = None
    if held and kind is LeaseKind.RUN:
        assert stored is not None and thread is not None
        held = stored["id"] is not None
        if held:
            # The runs row's own columns, and its thread's scope (as `run_row` returns it).
            run = {k: stored[k] for k in _run_columns(tuple(stored))}
            run["scope"] = thread["scope"]
    if not held or thread is None:
        lease_event("lost", lease.kind)
        raise LeaseLost(
            f"{lease.kind} lease on {lease.resource_id} expired or was taken over;"
            " nothing was written",
            token=lease.token,
        )
    assert stored is not None
    conn.note_version(lease.thread_id, int(thread["version"]))
    history = (HISTORY.joined(row) for row in rows)
    return Fenced(
        thread,
        run,
        TAIL.joined(stored) if tail else None,
        tail,
        FIRST_QUEUED.joined(stored) if queued else "unread",
        tuple(row for row in history if row is not None),
    )
