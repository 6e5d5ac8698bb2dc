"""Reassigning an approval (SQLite and Postgres): one committed, audited transition under the
thread lock; refusals change nothing; an escalation replaces the reassigned deciders."""

from __future__ import annotations

import pytest

from runtime.approvals import ApprovalPolicy, Escalation, Reassignment
from runtime.approvals import decide_refusal as refusal
from runtime.domain import Role
from runtime.errors import DelegationNotAllowed, InvalidInput, NotADecider, RequesterExcluded
from runtime.storage.sql.audit_sql import SqlAuditLog
from runtime.storage.sql.hooks_sql import SqlHooks
from runtime.storage.sql.sql_store import SqlStore
from tests.conformance.store_helpers import SCOPE, SCOPES, suspend_under
from tests.conformance.test_sql_approval_deadlines import (
    action,
    fire_all,
    until_due,
)

DELEGABLE = ApprovalPolicy(
    groups=("ops",),
    delegation=True,
    exclude_requester=True,
    deadline=0.3,
    escalations=(Escalation(groups=("finance",), deadline=60),),
)


def by(subject: str, *groups: str, **to: str) -> Reassignment:
    return Reassignment(
        subject=subject, role="user", groups=frozenset(groups), display_name=subject.title(), **to
    )


async def version(store: SqlStore, thread_id: str) -> int:
    return (await store.snapshot(thread_id, SCOPES)).thread.version


async def test_a_decider_reassigns_and_an_escalation_replaces_it(sql_store: SqlStore) -> None:
    thread_id, _ = await suspend_under(sql_store, DELEGABLE)
    before = await version(sql_store, thread_id)
    done = await sql_store.reassign_action(
        thread_id, SCOPES, "act-1", by("olga", "ops", to_subject="zed")
    )
    assert done.version == before + 1 and not done.run_resumed
    moved = await action(sql_store, thread_id)
    assert moved is not None and moved.approval is not None
    state = moved.approval
    assert state.waiting_for == "zed" and state.assigned is not None
    assert refusal((Role.USER,), state, "olga", "user", frozenset({"ops"})) == "not_a_decider"
    assert refusal((Role.USER,), state, "zed", "user", frozenset()) is None
    [entry] = await SqlAuditLog(sql_store).audit_entries(SCOPE, thread_id=thread_id)
    assert (entry.event, entry.subject, entry.detail) == (
        "action.reassigned",
        "olga",
        "stage 0: to zed",
    )
    # The deadline stays; its escalation routes to the next stage, not to zed.
    assert state.due_at is not None
    await until_due(sql_store, state.due_at)
    assert await fire_all(SqlHooks(sql_store)) == 1
    escalated = await action(sql_store, thread_id)
    assert escalated is not None and escalated.approval is not None
    assert escalated.approval.assigned is None
    assert escalated.approval.waiting_for == "group finance"
    assert refusal((Role.USER,), escalated.approval, "zed", "user", frozenset()) is not None


@pytest.mark.parametrize(
    ("policy", "change", "error"),
    [
        (
            ApprovalPolicy(groups=("ops",)),
            by("olga", "ops", to_subject="zed"),
            DelegationNotAllowed,
        ),
        (DELEGABLE, by("carl", "sales", to_subject="zed"), NotADecider),
        (DELEGABLE, by("alice", "ops", to_subject="zed"), RequesterExcluded),
        (DELEGABLE, by("olga", "ops"), InvalidInput),
        (DELEGABLE, by("olga", "ops", to_subject="z", to_group="g"), InvalidInput),
    ],
)
async def test_a_refused_reassignment_changes_nothing(
    sql_store: SqlStore, policy: ApprovalPolicy, change: Reassignment, error: type[Exception]
) -> None:
    thread_id, _ = await suspend_under(sql_store, policy)
    before = await version(sql_store, thread_id)
    held = await action(sql_store, thread_id)
    with pytest.raises(error):
        await sql_store.reassign_action(thread_id, SCOPES, "act-1", change)
    assert await version(sql_store, thread_id) == before
    assert await action(sql_store, thread_id) == held
    assert await SqlAuditLog(sql_store).audit_entries(SCOPE) == []
