"""Approval deadlines as durable timers: armed with the suspension, fired once as one transition."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.approvals import ApprovalState, DeadlineMove, armed, deadline_move
from runtime.domain import Part, Resolution, Role, ToolCallPart
from runtime.storage.decisions import find_action, has_pending
from runtime.storage.hooks_store import DueTimer, WebhookEvent
from runtime.storage.sql import audit_tx
from runtime.storage.sql.actions_tx import DEADLINE_KIND, deadline_ref, wake_run
from runtime.storage.sql.core import Conn, bump, lock_thread
from runtime.storage.sql.rows import decode_parts, encode_parts
from runtime.storage.sql.threads_tx import tail_row
from runtime.storage.sql.timers_tx import TimerOutcome, register_timer_kind, set_timer
from runtime.storage.sql.webhooks_tx import record_event
from runtime.storage.store import AdmissionLimits

# Who the audit chain and the resolution name when a deadline moves an action on.
SYSTEM_SUBJECT = "system"
SYSTEM_NAME = "Threadline (deadline)"
_EVENTS = {
    "escalate": WebhookEvent.ACTION_ESCALATED,
    "deny": WebhookEvent.ACTION_EXPIRED,
    "approve": WebhookEvent.ACTION_EXPIRED,
}


def _approval(part: Part) -> ApprovalState | None:
    if isinstance(part, ToolCallPart) and part.is_pending and part.waiting is not None:
        return part.waiting.approval
    return None


def _with_approval(part: ToolCallPart, state: ApprovalState) -> ToolCallPart:
    assert part.waiting is not None
    return part.model_copy(update={"waiting": part.waiting.model_copy(update={"approval": state})})


async def arm_deadlines(conn: Conn, thread_id: str, parts: Sequence[Part]) -> list[Part] | None:
    """In the transaction that writes `parts` (the one suspending their actions): set the
    first deadline of each newly pending action whose policy has one, by the database clock,
    and its timer. The parts to write instead (None: nothing to arm)."""
    if not any(_approval(part) is not None for part in parts):
        return None
    now = await conn.now()
    result: list[Part] = []
    changed = False
    for part in parts:
        state = _approval(part)
        due = None if state is None else armed(state, now)
        if due is not None and isinstance(part, ToolCallPart) and part.waiting is not None:
            assert due.due_at is not None
            await set_timer(
                conn, DEADLINE_KIND, deadline_ref(thread_id, part.waiting.action_id), due.due_at
            )
            part, changed = _with_approval(part, due), True
        result.append(part)
    return result if changed else None


class ApprovalDeadlineTimer:
    """The timer kind of approval deadlines: escalate to the next stage (the timer moves to
    its deadline) or end the action by the policy's expiry, in the fire's transaction. A fire
    on an action no longer pending (decided, cancelled, rewritten away) does nothing."""

    name = DEADLINE_KIND

    async def fire(
        self, conn: Conn, timer: DueTimer, limits: AdmissionLimits | None
    ) -> TimerOutcome:
        thread_id, _, action_id = timer.ref.partition("/")
        thread = await conn.fetchrow("SELECT id FROM threads WHERE id = $1", thread_id)
        if thread is None:
            return TimerOutcome(next_due=None)
        thread = await lock_thread(conn, thread_id)
        tail = await tail_row(conn, thread_id)
        parts = () if tail is None else decode_parts(tail["parts"])
        index = find_action(parts, action_id)
        state = None if index is None else _approval(parts[index])
        if tail is None or index is None or state is None or state.due_at is None:
            return TimerOutcome(next_due=None)
        run_id = tail["run_id"]
        if run_id is not None and await conn.fetchval(
            "SELECT stop_requested FROM runs WHERE id = $1", run_id
        ):
            return TimerOutcome(next_due=None)  # the stop's finalisation cancels the action
        now = await conn.now()
        move = deadline_move(state, now)
        part = parts[index]
        assert isinstance(part, ToolCallPart) and part.waiting is not None
        updated = _with_approval(part, move.state)
        if move.kind != "escalate":
            payload = state.policy.approve_payload if move.kind == "approve" else {}
            resolution = Resolution(
                subject=SYSTEM_SUBJECT,
                role=Role.BACKEND,
                payload=dict(payload),
                at=now,
                display_name=SYSTEM_NAME,
                decisions=state.decisions,
                by_deadline=move.kind,
                reason=move.reason,
            )
            assert updated.waiting is not None
            updated = updated.model_copy(
                update={"waiting": updated.waiting.model_copy(update={"resolution": resolution})}
            )
        new_parts = [*parts[:index], updated, *parts[index + 1 :]]
        await conn.execute(
            "UPDATE messages SET parts = $2, updated_at = $3 WHERE id = $1",
            tail["id"],
            encode_parts(new_parts),
            now,
        )
        scope = str(thread["scope"])
        await _record(conn, scope, thread_id, action_id, move, run_id, str(tail["id"]))
        resumed = False
        if move.kind != "escalate":
            resumed = await wake_run(conn, run_id, not has_pending(new_parts))
            await record_event(
                conn,
                scope,
                WebhookEvent.ACTION_RESOLVED,
                thread_id=thread_id,
                run_id=run_id,
                action_id=action_id,
                message_id=str(tail["id"]),
                detail=SYSTEM_SUBJECT,
            )
        return TimerOutcome(
            next_due=move.state.due_at if move.kind == "escalate" else None,
            thread_id=thread_id,
            version=await bump(conn, thread_id),
            run_id=run_id if resumed else None,
        )


async def _record(
    conn: Conn,
    scope: str,
    thread_id: str,
    action_id: str,
    move: DeadlineMove,
    run_id: str | None,
    message_id: str,
) -> None:
    """The transition's audit entry (actor: the system, with the reason) and webhook event."""
    event = "action.escalated" if move.kind == "escalate" else f"action.expired.{move.kind}"
    await audit_tx.append(
        conn,
        scope,
        event=event,
        thread_id=thread_id,
        action_id=action_id,
        subject=SYSTEM_SUBJECT,
        display_name=SYSTEM_NAME,
        detail=f"stage {move.state.stage}: {move.reason}",
        payload=move.state.policy.approve_payload if move.kind == "approve" else {},
        origin=None,
    )
    await record_event(
        conn,
        scope,
        _EVENTS[move.kind],
        thread_id=thread_id,
        run_id=run_id,
        action_id=action_id,
        message_id=message_id,
        detail=move.reason,
    )


register_timer_kind(ApprovalDeadlineTimer())

__all__ = ["SYSTEM_SUBJECT", "ApprovalDeadlineTimer", "arm_deadlines"]
