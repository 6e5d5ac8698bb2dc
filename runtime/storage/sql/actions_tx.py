"""Transaction functions for pending actions: the resolving compare-and-set under the thread
lock, and the index of action ids that finds an action outside the tail without a scan."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from runtime import instruments
from runtime.approvals import Reassignment, reassigned
from runtime.domain import Origin, Part, Resolution, RunStatus, ToolCallPart
from runtime.errors import Forbidden, InvalidInput, NotFound, RunStopping
from runtime.storage.decisions import (
    ResolvedAction,
    action_conflict,
    action_ids,
    check_expected_version,
    find_action,
    resolve_action,
    stale_action_error,
)
from runtime.storage.hooks_store import WebhookEvent
from runtime.storage.sql import audit_tx
from runtime.storage.sql.core import Conn, bump, lock_thread
from runtime.storage.sql.rows import decode_parts, encode_parts
from runtime.storage.sql.threads_tx import tail_row
from runtime.storage.sql.timers_tx import delete_timer
from runtime.storage.sql.webhooks_tx import record_event
from runtime.storage.store import ResolveResult


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
        # One indexed row (message_actions), never a scan of the thread's messages.
        row = await conn.fetchrow(
            "SELECT m.parts FROM message_actions a JOIN messages m ON m.id = a.message_id"
            " WHERE a.thread_id = $1 AND a.action_id = $2",
            thread_id,
            action_id,
        )
        older = () if row is None else (decode_parts(row["parts"]),)
        raise stale_action_error(older, action_id)
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
    scope = str(thread["scope"])
    if outcome.decision is not None:
        await _record(conn, scope, thread_id, action_id, resolution, outcome)
    if not outcome.settled:
        # A partial decision: committed and shown, but the action and its run stay waiting.
        return ResolveResult(
            thread_id=thread_id,
            version=await bump(conn, thread_id),
            run_id=run_id,
            run_resumed=False,
        )
    # A decided action's deadline is cancelled with the decision (a fire in flight finds its
    # token gone; one that would come later finds nothing pending anyway).
    await delete_timer(conn, DEADLINE_KIND, deadline_ref(thread_id, action_id))
    resumed = await wake_run(conn, run_id, outcome.last_pending)
    # The webhook outbox row, in this transaction: it exists if and only if the resolution does.
    await record_event(
        conn,
        scope,
        WebhookEvent.ACTION_RESOLVED,
        thread_id=thread_id,
        run_id=run_id,
        action_id=action_id,
        message_id=str(tail["id"]),
        detail=resolution.subject,
    )
    return ResolveResult(
        thread_id=thread_id,
        version=await bump(conn, thread_id),
        run_id=run_id,
        run_resumed=resumed,
    )


DEADLINE_KIND = "approval_deadline"


def deadline_ref(thread_id: str, action_id: str) -> str:
    """The approval-deadline timer's ref: the thread and the action it moves on."""
    return f"{thread_id}/{action_id}"


async def wake_run(conn: Conn, run_id: str | None, last_pending: bool) -> bool:
    """Make a waiting run runnable once its tail's last pending action is resolved; whether
    it was (a worker resumes it on the wakeup published after commit)."""
    if run_id is None or not last_pending:
        return False
    status = await conn.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
    if status != RunStatus.WAITING:
        return False
    await conn.execute(
        # The next episode resumes; one after it (episode past this count) is a takeover.
        # It links to the request that resumed it (when one is traced), as a wakeup's.
        "UPDATE runs SET status = 'running', resumed_episode = episode, updated_at = $2,"
        " traceparent = COALESCE($3, traceparent) WHERE id = $1",
        run_id,
        await conn.now(),
        instruments.current_traceparent(),
    )
    return True


async def _record(
    conn: Conn,
    scope: str,
    thread_id: str,
    action_id: str,
    resolution: Resolution,
    outcome: ResolvedAction,
) -> None:
    """The decision's row and its audit entry, in the transaction that commits the decision."""
    decision = outcome.decision
    assert decision is not None
    await audit_tx.record_decision(conn, thread_id, action_id, decision)
    verdict = "approved" if decision.approved else "denied"
    index = find_action(outcome.parts, action_id)
    part = None if index is None else outcome.parts[index]
    waiting = part.waiting if isinstance(part, ToolCallPart) else None
    approval = None if waiting is None else waiting.approval
    progress = "" if approval is None else f" ({approval.approvals} of {approval.policy.quorum})"
    await audit_tx.append(
        conn,
        scope,
        event=f"action.{verdict}",
        thread_id=thread_id,
        action_id=action_id,
        subject=decision.subject,
        display_name=decision.display_name,
        detail=f"{verdict}{progress}{'; resolved' if outcome.settled else ''}",
        payload=decision.payload,
        origin=resolution.origin,
    )
    await record_event(
        conn,
        scope,
        WebhookEvent.ACTION_DECIDED,
        thread_id=thread_id,
        action_id=action_id,
        detail=f"{decision.subject}: {verdict}{progress}",
    )


async def index_actions(conn: Conn, thread_id: str, message_id: str, parts: Sequence[Part]) -> None:
    """Record which message holds each action id of `parts`; called in the transaction that
    writes the message, so the index never disagrees with a committed message."""
    for action_id in action_ids(parts):
        await conn.execute(
            "INSERT INTO message_actions (thread_id, action_id, message_id) VALUES ($1, $2, $3)"
            " ON CONFLICT (thread_id, action_id) DO UPDATE SET message_id = excluded.message_id",
            thread_id,
            action_id,
            message_id,
        )


async def reassign(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str],
    action_id: str,
    change: Reassignment,
    origin: Origin | None,
) -> ResolveResult:
    """Hand a pending approval to another subject or group (`approvals.reassigned`), under the
    thread lock as a decision is; audited with who asked, from where. Its deadline stays."""
    thread = await lock_thread(conn, thread_id, scopes)
    tail = await tail_row(conn, thread_id)
    parts = () if tail is None else decode_parts(tail["parts"])
    index = find_action(parts, action_id) if tail is not None else None
    if tail is None or index is None:
        raise NotFound(f"action {action_id} not found")
    part = parts[index]
    assert isinstance(part, ToolCallPart) and part.waiting is not None
    if not part.is_pending:
        raise action_conflict(action_id, part)
    if change.role not in part.waiting.allowed_roles:
        raise Forbidden(f"role {change.role} may not decide action {action_id}")
    if part.waiting.approval is None:
        raise InvalidInput(f"action {action_id} has no approval policy to reassign under")
    state = reassigned(
        part.waiting.approval,
        change.subject,
        change.role,
        change.groups,
        to_subject=change.to_subject,
        to_group=change.to_group,
    )
    waiting = part.waiting.model_copy(update={"approval": state})
    new_parts = [*parts[:index], part.model_copy(update={"waiting": waiting}), *parts[index + 1 :]]
    await conn.execute(
        "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
        tail["id"],
        encode_parts(new_parts),
        await conn.now(),
    )
    await audit_tx.append(
        conn,
        str(thread["scope"]),
        event="action.reassigned",
        thread_id=thread_id,
        action_id=action_id,
        subject=change.subject,
        display_name=change.display_name,
        detail=f"stage {state.stage}: to {state.waiting_for}",
        payload={"to_subject": change.to_subject, "to_group": change.to_group},
        origin=origin,
    )
    return ResolveResult(
        thread_id=thread_id,
        version=await bump(conn, thread_id),
        run_id=tail["run_id"],
        run_resumed=False,
    )
