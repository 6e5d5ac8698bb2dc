"""Audit log conformance (SQLite and Postgres): decisions append a chain the reader pages through
and `verify` accepts; a routed approval's progress reads back from storage."""

from __future__ import annotations

from runtime.approvals import ApprovalDecision, ApprovalPolicy, ApprovalState
from runtime.domain import Origin, Resolution, Role, ToolCallPart
from runtime.service.audit import verify_scope
from runtime.storage.audit_chain import payload_hash
from runtime.storage.sql.audit_sql import SqlAuditLog
from runtime.storage.sql.sql_store import SqlStore
from tests.conformance.store_helpers import (
    SCOPE,
    SCOPES,
    suspend_under,
)

POLICY = ApprovalPolicy(quorum=2, exclude_requester=True)


def decision(subject: str, approved: bool = True) -> Resolution:
    payload = {"approved": approved}
    return Resolution(
        subject=subject,
        role=Role.USER,
        payload=payload,
        at=1.0,
        decision=ApprovalDecision(
            subject=subject,
            display_name=subject.title(),
            approved=approved,
            payload=payload,
            at=1.0,
        ),
        origin=Origin(
            transport="websocket", client_address="10.0.0.7", user_agent="ua", token_id="k1"
        ),
    )


async def test_decisions_append_a_chain_that_pages_and_verifies(sql_store: SqlStore) -> None:
    first = (await suspend_under(sql_store, POLICY, "need two"))[0]
    second = (await suspend_under(sql_store, POLICY, "need two"))[0]
    partial = await sql_store.resolve_action(first, SCOPES, "act-1", decision("bob"))
    assert not partial.run_resumed
    # The progress is committed state: it reads back from storage (computed fields and all).
    [action] = (await sql_store.snapshot(first, SCOPES)).pending_actions
    assert action.approval is not None and action.approval.approvals == 1
    assert [d.display_name for d in action.approval.decisions] == ["Bob"]
    await sql_store.resolve_action(second, SCOPES, "act-1", decision("carol", approved=False))
    done = await sql_store.resolve_action(first, SCOPES, "act-1", decision("dave"))
    assert done.run_resumed

    log = SqlAuditLog(sql_store)
    entries = await log.audit_entries(SCOPE)
    assert [(e.seq, e.thread_id, e.subject) for e in entries] == [
        (1, first, "bob"),
        (2, second, "carol"),
        (3, first, "dave"),
    ]
    assert [e.detail for e in entries] == [
        "approved (1 of 2)",
        "denied (0 of 2); resolved",
        "approved (2 of 2); resolved",
    ]
    bob = entries[0]
    assert (bob.transport, bob.client_address, bob.user_agent, bob.token_id) == (
        "websocket",
        "10.0.0.7",
        "ua",
        "k1",
    )
    assert bob.display_name == "Bob" and bob.payload_hash == payload_hash({"approved": True})
    assert [e.prev_hash for e in entries[1:]] == [e.hash for e in entries[:-1]]
    # One thread's entries, and pages after a seq.
    assert [e.seq for e in await log.audit_entries(SCOPE, thread_id=first)] == [1, 3]
    assert [e.seq for e in await log.audit_entries(SCOPE, after=1, limit=1)] == [2]
    assert await log.audit_entries("other") == []
    report = await verify_scope(log, SCOPE, page=2)  # pages of two: the walk crosses pages
    assert report.ok and report.entries == 3


async def test_a_pending_part_under_a_policy_survives_a_reload(sql_store: SqlStore) -> None:
    thread_id = (await suspend_under(sql_store, POLICY, "need two"))[0]
    part = (await sql_store.list_messages(thread_id))[-1].parts[-1]
    assert isinstance(part, ToolCallPart) and part.waiting is not None
    assert part.waiting.approval == ApprovalState(policy=POLICY, requester="alice")
