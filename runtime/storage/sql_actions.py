"""Transaction function for resolving a pending action: compare-and-set under the thread lock."""

from __future__ import annotations

from collections.abc import Collection

from runtime.domain import Resolution, RunStatus
from runtime.errors import RunStopping
from runtime.storage.base import ResolveResult
from runtime.storage.decisions import check_expected_version, resolve_action, stale_action_error
from runtime.storage.sql_core import Conn, bump, lock_thread
from runtime.storage.sql_rows import decode_parts, dumps, encode_parts, like_pattern
from runtime.storage.sql_threads import tail_row


async def resolve(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str],
    action_id: str,
    resolution: Resolution,
    expected_version: int | None,
) -> ResolveResult:
    # The thread lock makes the compare-and-set race-free: of concurrent resolutions the first
    # to lock wins, every later one sees its result.
    thread = await lock_thread(conn, thread_id, scopes)
    check_expected_version(thread_id, int(thread["version"]), expected_version)
    tail = await tail_row(conn, thread_id)
    outcome = None
    if tail is not None:
        outcome = resolve_action(decode_parts(tail["parts"]), action_id, resolution)
    if tail is None or outcome is None:
        # Only a candidate filter: the decision reads the decoded parts.
        rows = await conn.fetch(
            "SELECT parts FROM messages WHERE thread_id = $1 AND parts LIKE $2 ESCAPE '\\'"
            " ORDER BY position DESC",
            thread_id,
            like_pattern(dumps(action_id)[1:-1]),
        )
        raise stale_action_error((decode_parts(row["parts"]) for row in rows), action_id)
    run_id = tail["run_id"]
    if run_id is not None and await conn.fetchval(
        "SELECT stop_requested FROM runs WHERE id = $1", run_id
    ):
        # Answering 200 would be a lie: the stop's finalisation cancels this action next.
        raise RunStopping(f"run {run_id} is stopping; its actions are being cancelled")
    await conn.execute(
        "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
        tail["id"],
        encode_parts(outcome.parts),
        await conn.now(),
    )
    resumed = False
    if run_id is not None and outcome.last_pending:
        status = await conn.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
        if status == RunStatus.WAITING:
            await conn.execute(
                # The next episode resumes; one after it (episode past this count) is a takeover.
                "UPDATE runs SET status = 'running', resumed_episode = episode, updated_at = $2"
                " WHERE id = $1",
                run_id,
                await conn.now(),
            )
            resumed = True
    return ResolveResult(
        thread_id=thread_id,
        version=await bump(conn, thread_id),
        run_id=run_id,
        run_resumed=resumed,
    )
