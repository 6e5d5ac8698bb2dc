"""Approval deadlines as durable timers (SQLite and Postgres): armed with the suspension by the
database clock, escalated and expired as one committed transition each, once, audited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from realtime.memory import MemoryBus
from runtime.approvals import ApprovalDecision, ApprovalPolicy, ApprovalState, Escalation
from runtime.approvals import decide_refusal as refusal
from runtime.domain import PendingAction, Resolution, Role, RunStatus, ToolCallPart, ToolState
from runtime.engine.publisher import Publisher
from runtime.hooks.timer_loop import TimerLoop
from runtime.storage.hooks_store import WebhookEvent
from runtime.storage.sql.audit_sql import SqlAuditLog
from runtime.storage.sql.hooks_sql import SqlHooks
from runtime.storage.sql.sql_store import SqlStore
from runtime.storage.store import StepCommit, TailUpdate
from tests.conformance.store_helpers import (
    SCOPE,
    SCOPES,
    assistant,
    finish,
    new_thread,
    pending_part,
    start_run,
    suspend_under,
)

STAGE = 0.3
ESCALATING = ApprovalPolicy(
    groups=("ops",),
    deadline=STAGE,
    escalations=(Escalation(groups=("finance",), deadline=STAGE),),
    on_expiry="deny",
    expiry_reason="nobody answered in time",
)
AUTO_APPROVE = ApprovalPolicy(
    deadline=STAGE,
    on_expiry="approve",
    expiry_reason="low risk: approved when unanswered",
    approve_payload={"approved": True, "note": "auto"},
)


@pytest.fixture
async def hooks(sql_store: SqlStore) -> AsyncIterator[SqlHooks]:
    yield SqlHooks(sql_store)


async def action(store: SqlStore, thread_id: str) -> PendingAction | None:
    pending = (await store.snapshot(thread_id, SCOPES)).pending_actions
    return pending[0] if pending else None


async def tool_part(store: SqlStore, thread_id: str) -> ToolCallPart:
    part = (await store.list_messages(thread_id))[-1].parts[-1]
    assert isinstance(part, ToolCallPart)
    return part


async def until_due(store: SqlStore, due_at: float) -> None:
    """Wait (by the database clock) until `due_at` has passed; bounded."""
    for _ in range(100):
        if await store.db_time() > due_at:
            return
        await asyncio.sleep(max(0.01, due_at - await store.db_time()))
    raise AssertionError("the database clock never passed the deadline")


async def fire_all(hooks: SqlHooks, owner: str = "w1") -> int:
    fired = 0
    for timer in await hooks.claim_timers(owner, 5.0, 10):
        fired += (await hooks.fire_timer(timer)).fired
    return fired


async def test_escalation_then_auto_deny(sql_store: SqlStore, hooks: SqlHooks) -> None:
    before = await sql_store.db_time()
    thread_id, run_id = await suspend_under(sql_store, ESCALATING)
    first = await action(sql_store, thread_id)
    assert first is not None and first.approval is not None
    # Armed in the suspending transaction, by the database clock.
    assert first.approval.due_at is not None
    assert before + STAGE <= first.approval.due_at <= await sql_store.db_time() + STAGE
    assert (first.approval.stage, first.approval.waiting_for) == (0, "group ops")
    assert await fire_all(hooks) == 0  # not due yet

    await until_due(sql_store, first.approval.due_at)
    version = (await sql_store.snapshot(thread_id, SCOPES)).thread.version
    assert await fire_all(hooks) == 1
    escalated = await action(sql_store, thread_id)
    assert escalated is not None and escalated.approval is not None
    state = escalated.approval
    assert (state.stage, state.waiting_for) == (1, "group finance")
    assert state.due_at is not None and state.due_at >= first.approval.due_at + STAGE
    assert (await sql_store.snapshot(thread_id, SCOPES)).thread.version == version + 1
    assert (await sql_store.get_run(run_id)).status is RunStatus.WAITING
    # Routed anew: ops may no longer decide, finance may.
    assert refusal((Role.USER,), state, "olga", "user", frozenset({"ops"})) == "not_a_decider"
    assert refusal((Role.USER,), state, "fred", "user", frozenset({"finance"})) is None

    await until_due(sql_store, state.due_at)
    assert await fire_all(hooks) == 1
    assert await action(sql_store, thread_id) is None
    part = await tool_part(sql_store, thread_id)
    assert part.waiting is not None and part.waiting.resolution is not None
    resolution = part.waiting.resolution
    assert (resolution.subject, resolution.by_deadline) == ("system", "deny")
    assert resolution.reason == "nobody answered in time"
    # The run goes on: the next episode ends the call with the model-visible rejection.
    assert (await sql_store.get_run(run_id)).status is RunStatus.RUNNING
    assert await fire_all(hooks) == 0  # the timer is gone

    entries = await SqlAuditLog(sql_store).audit_entries(SCOPE, thread_id=thread_id)
    assert [(e.event, e.subject) for e in entries] == [
        ("action.escalated", "system"),
        ("action.expired.deny", "system"),
    ]
    assert "escalated to group finance" in entries[0].detail
    assert entries[1].detail == "stage 1: nobody answered in time"


async def test_auto_approve_records_its_reason(sql_store: SqlStore, hooks: SqlHooks) -> None:
    thread_id, run_id = await suspend_under(sql_store, AUTO_APPROVE)
    first = await action(sql_store, thread_id)
    assert first is not None and first.approval is not None and first.approval.due_at
    await until_due(sql_store, first.approval.due_at)
    assert await fire_all(hooks) == 1
    part = await tool_part(sql_store, thread_id)
    assert part.waiting is not None and part.waiting.resolution is not None
    resolution = part.waiting.resolution
    assert resolution.by_deadline == "approve"
    assert resolution.payload == {"approved": True, "note": "auto"}
    assert resolution.reason == "low risk: approved when unanswered"
    assert (await sql_store.get_run(run_id)).status is RunStatus.RUNNING
    [entry] = await SqlAuditLog(sql_store).audit_entries(SCOPE, thread_id=thread_id)
    assert (entry.event, entry.subject) == ("action.expired.approve", "system")
    assert entry.detail == "stage 0: low risk: approved when unanswered"


def decision(subject: str) -> Resolution:
    payload = {"approved": True}
    return Resolution(
        subject=subject,
        role=Role.USER,
        payload=payload,
        at=1.0,
        decision=ApprovalDecision(
            subject=subject, display_name=subject, approved=True, payload=payload, at=1.0
        ),
    )


async def test_decided_before_the_fire_cancels_the_timer(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    policy = ApprovalPolicy(deadline=STAGE)
    thread_id, _ = await suspend_under(sql_store, policy)
    first = await action(sql_store, thread_id)
    assert first is not None and first.approval is not None and first.approval.due_at
    await until_due(sql_store, first.approval.due_at)
    # Claimed, then decided before it fires: the deciding transaction deleted the timer, so
    # the fire commits nothing.
    [claimed] = await hooks.claim_timers("w1", 5.0, 10)
    done = await sql_store.resolve_action(thread_id, SCOPES, "act-1", decision("bob"))
    assert done.run_resumed
    assert not (await hooks.fire_timer(claimed)).fired
    assert await hooks.claim_timers("w2", 5.0, 10) == []
    part = await tool_part(sql_store, thread_id)
    assert part.waiting is not None and part.waiting.resolution is not None
    assert part.waiting.resolution.subject == "bob"
    events = [e.event for e in await SqlAuditLog(sql_store).audit_entries(SCOPE)]
    assert events == ["action.approved"]


async def test_a_fire_on_an_action_no_longer_pending_does_nothing(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    thread_id, run_id = await suspend_under(sql_store, ApprovalPolicy(deadline=STAGE))
    first = await action(sql_store, thread_id)
    assert first is not None and first.approval is not None and first.approval.due_at
    # The run ends (its stop finalisation cancels the action) while its timer stays.
    lease = await sql_store.acquire_run_lease(run_id, "w1", 30.0)
    assert lease is None  # a waiting run is not leasable: stop it instead
    await sql_store.request_stop(thread_id, SCOPES, run_id)
    lease = await sql_store.acquire_run_lease(run_id, "w1", 30.0)
    assert lease is not None
    await sql_store.start_episode(lease)
    await finish(sql_store, lease, RunStatus.CANCELLED)
    version = (await sql_store.snapshot(thread_id, SCOPES)).thread.version
    await until_due(sql_store, first.approval.due_at)
    assert await fire_all(hooks) == 1  # fired: the timer is consumed, nothing else
    assert (await sql_store.snapshot(thread_id, SCOPES)).thread.version == version
    assert await SqlAuditLog(sql_store).audit_entries(SCOPE) == []
    assert await hooks.claim_timers("w2", 5.0, 10) == []


async def test_racing_timer_loops_fire_each_stage_once(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    thread_id, _ = await suspend_under(sql_store, ESCALATING)
    first = await action(sql_store, thread_id)
    assert first is not None and first.approval is not None and first.approval.due_at
    publisher = Publisher(MemoryBus())
    loops = [TimerLoop(hooks, publisher, lease_ttl=5.0, owner=f"loop{n}") for n in range(3)]
    audit = SqlAuditLog(sql_store)
    due: float | None = first.approval.due_at
    # Each stage's deadline, then rounds of all loops at once. On a slow box the rounds after
    # the escalation can outlast the next stage, which then fires in them: that is still once.
    for _ in range(2):
        if due is None:
            break
        await until_due(sql_store, due)
        for _ in range(3):
            await asyncio.gather(*(loop.run_due() for loop in loops))
        now = await action(sql_store, thread_id)
        due = None if now is None or now.approval is None else now.approval.due_at
    events = [e.event for e in await audit.audit_entries(SCOPE, thread_id=thread_id)]
    assert events == ["action.escalated", "action.expired.deny"]
    assert await action(sql_store, thread_id) is None


async def test_decisions_escalations_and_expiries_are_webhook_events(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    wanted = [
        WebhookEvent.ACTION_DECIDED,
        WebhookEvent.ACTION_ESCALATED,
        WebhookEvent.ACTION_EXPIRED,
        WebhookEvent.ACTION_RESOLVED,
    ]
    subscription = await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/a", wanted, "whsec_dGVzdA==", "ops"
    )
    decided, _ = await suspend_under(sql_store, ApprovalPolicy(quorum=2))
    await sql_store.resolve_action(decided, SCOPES, "act-1", decision("bob"))
    expiring, _ = await suspend_under(sql_store, ESCALATING)
    first = await action(sql_store, expiring)
    assert first is not None and first.approval is not None and first.approval.due_at
    await until_due(sql_store, first.approval.due_at)
    assert await fire_all(hooks) == 1
    escalated = await action(sql_store, expiring)
    assert escalated is not None and escalated.approval is not None and escalated.approval.due_at
    await until_due(sql_store, escalated.approval.due_at)
    assert await fire_all(hooks) == 1
    bodies = [d.payload() for d in await hooks.list_deliveries(SCOPES, subscription.id)]
    seen = [(b["type"], b["data"]["thread_id"]) for b in bodies]
    # In commit order; the expiry's two events share its transaction, in either order.
    assert seen[:2] == [("action.decided", decided), ("action.escalated", expiring)]
    assert sorted(seen[2:]) == [("action.expired", expiring), ("action.resolved", expiring)]
    data = {b["type"]: b["data"] for b in bodies}
    assert data["action.decided"]["decision"] == "bob: approved (1 of 2)"
    assert "escalated to group finance" in data["action.escalated"]["reason"]
    assert data["action.expired"]["reason"] == "nobody answered in time"
    assert data["action.resolved"]["resolved_by"] == "system"


async def test_a_workers_tail_update_keeps_the_committed_approval_state(
    sql_store: SqlStore,
) -> None:
    """A step commits an action while another tool of the step still runs; a decision lands;
    the step's next tail update carries the parts as the worker built them. The deadline is
    neither re-armed nor the decision undone."""
    thread = await new_thread(sql_store)
    _, lease = await start_run(sql_store, thread.id)
    part = pending_part("act-1")
    assert part.waiting is not None
    built = part.model_copy(
        update={
            "waiting": part.waiting.model_copy(
                update={"approval": ApprovalState(policy=ApprovalPolicy(quorum=2, deadline=60))}
            )
        }
    )
    other = pending_part("act-2").model_copy(update={"state": ToolState.RUNNING, "waiting": None})
    await sql_store.commit(lease, StepCommit(append=(assistant(built, other),)))
    armed_action = await action(sql_store, thread.id)
    assert armed_action is not None and armed_action.approval is not None
    due = armed_action.approval.due_at
    assert due is not None
    await sql_store.resolve_action(thread.id, SCOPES, "act-1", decision("bob"))
    message_id = (await sql_store.list_messages(thread.id))[-1].id
    finished = other.transition(ToolState.OUTPUT_AVAILABLE, output={"ok": True})
    await sql_store.commit(
        lease, StepCommit(update_tail=TailUpdate(message_id=message_id, parts=(built, finished)))
    )
    kept = await action(sql_store, thread.id)
    assert kept is not None and kept.approval is not None
    assert kept.approval.due_at == due
    assert [d.subject for d in kept.approval.decisions] == ["bob"]
