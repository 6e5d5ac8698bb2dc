"""Transaction functions for runs: reads, stop requests, episodes, the owner-fenced step commit."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from runtime import instruments
from runtime.domain import (
    Lease,
    LeaseKind,
    NewMessage,
    Part,
    Run,
    RunStatus,
    check_run_transition,
)
from runtime.errors import Conflict, NotFound
from runtime.storage.decisions import (
    StopOutcome,
    check_commit,
    check_run_message,
    check_tail_update,
    episode_status,
    keep_approvals,
    next_seq_changes,
    plan_run_target,
    stop_outcome,
)
from runtime.storage.sql.actions_tx import index_actions
from runtime.storage.sql.core import Conn, bump, lock_thread
from runtime.storage.sql.deadlines_tx import arm_deadlines
from runtime.storage.sql.leases_tx import (
    Fenced,
    acquire_run_lease,
    fence,
    live_lease,
    release_with_commit,
)
from runtime.storage.sql.queue_tx import admit_next, append_message
from runtime.storage.sql.rows import (
    Row,
    decode_parts,
    encode_parts,
    message_from_row,
    run_from_row,
    thread_from_row,
)
from runtime.storage.sql.threads_tx import (
    ACTIVE_STATUSES,
    active_run_row,
    read_history,
    run_row,
    tail_row,
)
from runtime.storage.store import (
    CommitResult,
    EpisodeStart,
    HistoryRead,
    RunChange,
    RunStart,
    StartedRun,
    StepCommit,
    StopResult,
)


async def get_run(conn: Conn, run_id: str) -> Run:
    row = await run_row(conn, run_id)
    if row is None:
        raise NotFound(f"run {run_id} not found")
    return run_from_row(row)


async def active_run(conn: Conn, thread_id: str) -> Run | None:
    row = await active_run_row(conn, thread_id)
    return None if row is None else run_from_row(row)


async def find_runnable_runs(conn: Conn, limit: int) -> list[Run]:
    """Runnable runs, round robin across scopes, so one tenant's burst delays another tenant's
    run by at most one run.

    A run's turn is its place in its scope's line, counting the scope's runs a worker holds
    first: a scope running k runs offers its next at turn k + 1, after every scope running
    fewer. Of equal turns, the scope a worker served longest ago (`scope_turns`, written when
    a run lease is granted; never served counts as longest) goes first, then the oldest run.
    """
    args: list[Any] = [int(limit)]
    clock, now = "", "$2"
    if conn.dialect.local_clock is None:
        # The database clock, read by the query itself, once (one round trip, not two).
        clock = f"WITH clock_ AS (SELECT {conn.dialect.now_sql} AS now_) "
        now = "(SELECT now_ FROM clock_)"
    else:
        args.append(await conn.now())
    rows = await conn.fetch(
        f"{clock}SELECT runnable.* FROM ("
        "  SELECT r.*, t.scope, held.resource_id AS held_by_worker,"
        "   ROW_NUMBER() OVER (PARTITION BY t.scope"
        "    ORDER BY CASE WHEN held.resource_id IS NULL THEN 1 ELSE 0 END, r.created_at, r.id)"
        "    AS turn"
        "  FROM runs r JOIN threads t ON t.id = r.thread_id"
        "  LEFT JOIN leases held ON held.kind = 'run' AND held.resource_id = r.id"
        f"   AND held.expires_at > {now}"
        f" WHERE r.status IN {ACTIVE_STATUSES}"
        "  AND (r.status <> 'waiting' OR r.stop_requested = TRUE)"
        ") AS runnable LEFT JOIN scope_turns s ON s.scope = runnable.scope"
        " WHERE runnable.held_by_worker IS NULL"
        "  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.kind = 'admin'"
        f"   AND l.resource_id = runnable.thread_id AND l.expires_at > {now})"
        " ORDER BY runnable.turn, COALESCE(s.served_at, 0), runnable.created_at, runnable.id"
        " LIMIT $1",
        *args,
    )
    return [run_from_row(row) for row in rows]


def _cancelled_event() -> None:
    instruments.safe_add(instruments.RUNS, 1, {"event": RunStatus.CANCELLED.value})


async def request_stop(
    conn: Conn, thread_id: str, scopes: Collection[str], run_id: str
) -> StopResult:
    thread = await lock_thread(conn, thread_id, scopes)
    run = await run_row(conn, run_id, thread_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    status = RunStatus(run["status"])
    version = int(thread["version"])
    leased = await live_lease(conn, LeaseKind.RUN, run_id) is not None
    outcome = stop_outcome(status, bool(run["stop_requested"]), leased)
    if outcome is StopOutcome.CANCEL_NOW:
        await conn.execute(
            "UPDATE runs SET status = 'cancelled', stop_requested = FALSE,"
            " updated_at = $2 WHERE id = $1",
            run_id,
            await conn.now(),
        )
        await admit_next(conn, thread_id)
        version = await bump(conn, thread_id)
        status = RunStatus.CANCELLED
        # No episode ever ends this run, so its run event is counted here, once committed.
        conn.on_commit(_cancelled_event)
    elif outcome is StopOutcome.FLAG:
        # Not part of a snapshot: the worker finalises and commits the visible change.
        await conn.execute(
            "UPDATE runs SET stop_requested = TRUE, updated_at = $2 WHERE id = $1",
            run_id,
            await conn.now(),
        )
    return StopResult(thread_id=thread_id, version=version, run_id=run_id, status=status)


async def start_episode(conn: Conn, lease: Lease) -> tuple[Run, int]:
    fenced = await fence(conn, lease, LeaseKind.RUN)
    assert fenced.run is not None
    return await _start(conn, lease, fenced.thread, fenced.run)


async def begin_episode(conn: Conn, lease: Lease, history_from: int) -> EpisodeStart:
    started, history = await _begin(conn, lease, history_from)
    assert history is not None
    return EpisodeStart(**dict(started), history=history)


async def start_run(
    conn: Conn, run_id: str, owner: str, ttl: float, history: tuple[str, int] | None
) -> RunStart | None:
    """`Store.start_run` in one transaction where the dialect has no `start_run_function`
    (SQLite): the run lease as `acquire_run_lease` grants it, then the episode begun under it
    as `begin_episode` begins one; with `history` (the run's thread, from position), the
    thread's messages from there on are read with it (another thread named: none read)."""
    lease = await acquire_run_lease(conn, run_id, owner, ttl)
    if lease is None:
        return None
    read_from = None
    if history is not None and history[0] == lease.thread_id:
        read_from = history[1]
    started, read = await _begin(conn, lease, read_from)
    return RunStart(lease=lease, started=started, history=read)


async def _begin(
    conn: Conn, lease: Lease, history_from: int | None
) -> tuple[StartedRun, HistoryRead | None]:
    """Start the fenced run's episode; with `history_from`, read the thread's messages from
    there on first (None: no history read)."""
    # A read from the worker's cached tail (`history_from` > 0) is a few rows: read with the
    # fence, in its statement. A read of the whole thread is left to a statement of its own,
    # or every one of its rows would repeat the fence's columns.
    merged = history_from is not None and history_from > 0
    fenced = await fence(conn, lease, LeaseKind.RUN, history_from=history_from if merged else None)
    thread, before = fenced.thread, fenced.run
    assert before is not None
    # Read first: the start's writes change no message nor the history epoch, and so they
    # are left to go with COMMIT (`bump`).
    history = None
    if merged:
        messages = tuple(message_from_row(row) for row in fenced.history)
        history = HistoryRead(epoch=int(thread["history_epoch"]), messages=messages)
    elif history_from is not None:
        epoch, read = await read_history(conn, lease.thread_id, history_from)
        history = HistoryRead(epoch=epoch, messages=tuple(read))
    run, version = await _start(conn, lease, thread, before)
    started = StartedRun(
        before=run_from_row(before),
        run=run,
        version=version,
        # Read before start_episode's bump: only its version (and updated_at) moved since.
        thread=thread_from_row(thread).model_copy(update={"version": version}),
    )
    return started, history


async def _start(conn: Conn, lease: Lease, thread: Row, run: Row) -> tuple[Run, int]:
    status = RunStatus(run["status"])
    version = int(thread["version"])
    target = episode_status(status)
    if target is None:
        # Ended (e.g. stopped while queued) after the lease was taken: nothing to run.
        return run_from_row(run), version
    now = await conn.now()
    await conn.execute_later(
        "UPDATE runs SET episode = episode + 1, status = $2, updated_at = $3 WHERE id = $1",
        lease.resource_id,
        target.value,
        now,
    )
    if target is not status:
        version = await bump(conn, lease.thread_id)
    # The row as the UPDATE left it (the run row is read under the thread lock: nothing else
    # changed it), without reading it back.
    updated = {**run, "episode": int(run["episode"]) + 1, "status": target.value, "updated_at": now}
    return run_from_row(updated), version


async def commit(
    conn: Conn,
    lease: Lease,
    step: StepCommit,
    tail_parts: list[Part] | None,
    appends: list[tuple[NewMessage, str]],
) -> CommitResult:
    """The step commit, in the order `StepCommit` documents; `tail_parts` and `appends` are
    validated and encoded before the transaction. Says whether it admitted queued input, and
    whether it released the lease (a terminal transition does: the run is over, and the
    worker's separate release would be a round trip more)."""
    ending = step.run is not None and (
        step.run.status is RunStatus.WAITING or step.run.status.is_terminal
    )
    admitting = step.admit_next and step.run is not None and step.run.status.is_terminal
    # The tail and the first queued item, read with the fence when a write below needs them
    # (a statement fewer each; both change only under the thread lock, held since).
    fenced = await fence(
        conn,
        lease,
        LeaseKind.RUN,
        tail=step.update_tail is not None or bool(appends) or ending,
        queued=admitting,
    )
    thread, run = fenced.thread, fenced.run
    assert run is not None
    # Valid until the first write to the thread's messages; then each write reads its own.
    known: Fenced | None = fenced
    run_id = lease.resource_id
    thread_id = lease.thread_id
    status = RunStatus(run["status"])
    check_commit(run_id, status)
    changed = False
    if step.update_tail is not None and tail_parts is not None:
        await _update_tail(conn, thread_id, step.update_tail.message_id, tail_parts, known)
        known = None
        changed = True
    for message, parts_json in appends:
        tail = await _append_run_message(conn, thread_id, run_id, message, parts_json, known)
        # The message just written is the tail now: a later write here reads nothing.
        known = Fenced(thread, run, tail, tail_read=True)
        changed = True
    terminal = False
    next_seq = step.next_seq if next_seq_changes(int(run["next_seq"]), step.next_seq) else None
    if step.run is not None:
        check_run_transition(status, step.run.status)
        terminal = step.run.status.is_terminal
        if await _transition(conn, thread_id, run_id, step.run, known, next_seq):
            changed, next_seq = True, None  # written with the status
    if next_seq is not None:
        await conn.execute_later("UPDATE runs SET next_seq = $2 WHERE id = $1", run_id, next_seq)
        changed = True
    admitted = False
    if terminal and step.admit_next:
        admitted = await admit_next(conn, thread_id, fenced.queued) is not None
    if terminal:
        await release_with_commit(conn, lease)
    if not changed:
        return CommitResult(int(thread["version"]), admitted, terminal)
    return CommitResult(await bump(conn, thread_id), admitted, terminal)


async def _tail(conn: Conn, thread_id: str, known: Fenced | None) -> Row | None:
    """The thread's tail row: the one the fence read when still valid, else read now."""
    if known is not None and known.tail_read:
        return known.tail
    return await tail_row(conn, thread_id)


async def _update_tail(
    conn: Conn, thread_id: str, message_id: str, parts: list[Part], known: Fenced | None
) -> None:
    tail = await _tail(conn, thread_id, known)
    stored = decode_parts(tail["parts"]) if tail is not None else ()
    check_tail_update(thread_id, message_id, None if tail is None else tail["id"], stored, parts)
    parts = keep_approvals(stored, parts)
    parts = await arm_deadlines(conn, thread_id, parts) or parts
    await _write_parts(conn, message_id, encode_parts(parts))
    await index_actions(conn, thread_id, message_id, parts)


async def _append_run_message(
    conn: Conn,
    thread_id: str,
    run_id: str,
    message: NewMessage,
    parts_json: str,
    known: Fenced | None,
) -> Row:
    """Append a run's message after the tail; returns its row (the new tail)."""
    check_run_message(run_id, message.run_id)
    if message.id is not None:
        taken = Conflict(f"message {message.id} already exists")
        # Postgres checks the primary key when the held INSERT reaches it (with COMMIT).
        if not conn.defer_unique("messages_pkey", taken) and await conn.fetchval(
            "SELECT 1 FROM messages WHERE id = $1", message.id
        ):
            raise taken
    if message.client_request_id is not None and await conn.fetchval(
        "SELECT 1 FROM messages WHERE thread_id = $1 AND client_request_id = $2",
        thread_id,
        message.client_request_id,
    ):
        raise Conflict(f"client_request_id {message.client_request_id} is already used")
    deadlined = await arm_deadlines(conn, thread_id, message.parts)
    if deadlined is not None:
        parts_json = encode_parts(deadlined)
    row = await append_message(
        conn,
        thread_id,
        role=message.role,
        parts_json=parts_json,
        client_request_id=message.client_request_id,
        run_id=run_id,
        message_id=message.id,
        tail=await _tail(conn, thread_id, known),
    )
    await index_actions(conn, thread_id, str(row["id"]), message.parts)
    return row


async def _transition(
    conn: Conn,
    thread_id: str,
    run_id: str,
    change: RunChange,
    known: Fenced | None,
    next_seq: int | None = None,
) -> bool:
    """Apply a run transition as `plan_run_target` decides; False: the status stays. A
    `next_seq` to store goes in the same statement when the status is written."""
    target = change.status
    tail = None
    if target is RunStatus.WAITING or target.is_terminal:
        tail = await _tail(conn, thread_id, known)
    plan = plan_run_target(
        run_id,
        target,
        None if tail is None else tail["run_id"],
        decode_parts(tail["parts"]) if tail is not None else (),
    )
    if plan.tail_parts is not None and tail is not None:
        await _write_parts(conn, tail["id"], encode_parts(plan.tail_parts))
    if not plan.apply_status:
        return False
    update = (
        "UPDATE runs SET status = $2, error = $3,"
        " stop_requested = CASE WHEN $4 THEN FALSE ELSE stop_requested END, updated_at = $5"
    )
    args: list[Any] = [run_id, target.value, change.error, target.is_terminal, await conn.now()]
    if next_seq is not None:
        update += ", next_seq = $6"
        args.append(next_seq)
    await conn.execute_later(update + " WHERE id = $1", *args)
    return True


async def _write_parts(conn: Conn, message_id: str, parts_json: str) -> None:
    await conn.execute_later(
        "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
        message_id,
        parts_json,
        await conn.now(),
    )
