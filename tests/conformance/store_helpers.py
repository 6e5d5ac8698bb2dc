"""Builders shared by the store conformance suite: threads, started runs, pending tool parts."""

from __future__ import annotations

from collections.abc import Iterable

from runtime.approvals import ApprovalPolicy, ApprovalState
from runtime.domain import (
    Admission,
    Lease,
    MessageRole,
    NewMessage,
    Part,
    Resolution,
    Role,
    RunStatus,
    TextPart,
    Thread,
    ToolCallPart,
    ToolState,
    Waiting,
    WaitKind,
)
from runtime.storage import SqlStore
from runtime.storage.sql.core import Conn
from runtime.storage.store import CommitResult, RunChange, StepCommit, Store

SCOPE = "acme"
SCOPES = [SCOPE]
FOREIGN = ["other"]
SCHEMA = {"type": "object", "properties": {"approved": {"type": "boolean"}}}


async def new_thread(store: Store, title: str = "t", scope: str = SCOPE) -> Thread:
    return await store.create_thread(scope, title)


async def queued_run(store: Store) -> tuple[str, str]:
    """(thread id, run id): input on a new thread, its run queued."""
    thread = await new_thread(store)
    admission = await store.submit_input(thread.id, SCOPES, text="go", submitted_by="alice")
    assert admission.run_id is not None
    return thread.id, admission.run_id


async def counts(store: SqlStore) -> tuple[int, int]:
    """(idempotency keys stored, the fencing counter)."""

    async def read(conn: Conn) -> tuple[int, int]:
        keys = await conn.fetchval("SELECT COUNT(*) FROM commit_keys")
        return int(keys), int(await conn.fetchval("SELECT value FROM fencing_counter"))

    return await store._read(read)


async def start_run(
    store: Store, thread_id: str, text: str = "hello", owner: str = "w1", ttl: float = 30.0
) -> tuple[Admission, Lease]:
    """Submit input on an idle thread, take the run lease and start the first episode."""
    admission = await store.submit_input(thread_id, SCOPES, text=text, submitted_by="alice")
    assert admission.run_id is not None
    lease = await store.acquire_run_lease(admission.run_id, owner, ttl)
    assert lease is not None
    await store.start_episode(lease)
    return admission, lease


def pending_part(
    action_id: str = "act-1",
    roles: Iterable[Role] = (Role.USER, Role.BACKEND),
    tool_call_id: str | None = None,
) -> ToolCallPart:
    return ToolCallPart(
        tool_call_id=tool_call_id or f"call-{action_id}",
        name="send_email",
        input={"to": "a@example.com"},
        state=ToolState.AWAITING_ACTION,
        waiting=Waiting(
            action_id=action_id,
            kind=WaitKind.APPROVAL,
            payload_schema=SCHEMA,
            allowed_roles=tuple(roles),
        ),
    )


def assistant(*parts: Part) -> NewMessage:
    return NewMessage(role=MessageRole.ASSISTANT, parts=parts)


def text(value: str) -> TextPart:
    return TextPart(text=value)


async def suspend(store: Store, lease: Lease, *action_ids: str) -> CommitResult:
    """Commit an assistant message with pending actions and move the run to waiting."""
    parts = tuple(pending_part(action_id) for action_id in (action_ids or ("act-1",)))
    return await store.commit(
        lease,
        StepCommit(
            append=(assistant(text("need approval"), *parts),),
            run=RunChange(status=RunStatus.WAITING),
        ),
    )


async def finish(
    store: Store, lease: Lease, status: RunStatus = RunStatus.COMPLETED
) -> CommitResult:
    return await store.commit(lease, StepCommit(run=RunChange(status=status)))


def resolution(subject: str = "alice", role: Role = Role.USER, approved: bool = True) -> Resolution:
    return Resolution(subject=subject, role=role, payload={"approved": approved}, at=0.0)


def assert_contiguous(versions: Iterable[int], start: int) -> None:
    """Versions returned by N committed writes are exactly start+1 .. start+N: none lost or
    duplicated, no gap."""
    ordered = sorted(versions)
    assert ordered == list(range(start + 1, start + 1 + len(ordered))), ordered


async def suspend_under(
    store: Store, policy: ApprovalPolicy, say: str = "asking"
) -> tuple[str, str]:
    """(thread id, run id) of a run waiting on `act-1`, asked of by alice under `policy`; its
    lease released, as a worker leaves a suspended run."""
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    part = pending_part("act-1")
    assert part.waiting is not None
    waiting = part.waiting.model_copy(
        update={"approval": ApprovalState(policy=policy, requester="alice")}
    )
    await store.commit(
        lease,
        StepCommit(
            append=(assistant(text(say), part.model_copy(update={"waiting": waiting})),),
            run=RunChange(status=RunStatus.WAITING),
        ),
    )
    await store.release_lease(lease)
    assert admission.run_id is not None
    return thread.id, admission.run_id
