"""Answer bodies of commands, shared by the HTTP routes and websocket acks so both say the same."""

from __future__ import annotations

from typing import Any

from runtime.domain import Admission, Principal, Thread
from runtime.service.assigned import InboxPage
from runtime.storage.store import ResolveResult, RewriteResult, StopResult
from runtime.storage.thread_query import page_cursor
from threadline_wire.command_answers import (
    MetadataAnswer,
    RegenerateAnswer,
    StopAnswer,
    ThreadInfo,
    ThreadPage,
    VersionAnswer,
)
from threadline_wire.command_answers import (
    Principal as PrincipalAnswer,
)


def admission_answer(admission: Admission) -> dict[str, Any]:
    # The wire model's fields only: `interrupted_run_id` is the service's business.
    return admission.to_wire()


def version_answer(result: ResolveResult | RewriteResult) -> dict[str, Any]:
    return VersionAnswer(thread_id=result.thread_id, version=result.version).to_wire()


def thread_version_answer(thread: Thread) -> dict[str, Any]:
    return VersionAnswer(thread_id=thread.id, version=thread.version).to_wire()


def metadata_answer(thread: Thread) -> dict[str, Any]:
    return MetadataAnswer(
        thread_id=thread.id, version=thread.version, metadata=thread.metadata
    ).to_wire()


def stop_answer(result: StopResult) -> dict[str, Any]:
    return StopAnswer(
        thread_id=result.thread_id,
        version=result.version,
        run_id=result.run_id,
        status=result.status,
    ).to_wire()


def regenerate_answer(result: RewriteResult) -> dict[str, Any]:
    answer = RegenerateAnswer(
        thread_id=result.thread_id, version=result.version, run_id=result.run_id
    )
    return answer.to_wire()


def threads_answer(threads: list[Thread], limit: int | None = None) -> dict[str, Any]:
    # Private metadata never leaves the server. A full page may have more behind it: its last
    # thread's cursor pages on (None: this was the last page).
    full = limit is not None and bool(threads) and len(threads) >= limit
    page = ThreadPage(
        next_cursor=page_cursor(threads[-1]) if full else None,
        threads=[
            ThreadInfo(
                id=thread.id,
                scope=thread.scope,
                title=thread.title,
                version=thread.version,
                metadata=thread.metadata,
                owner=thread.owner,
                created_at=thread.created_at,
                updated_at=thread.updated_at,
            )
            for thread in threads
        ],
    )
    return page.to_wire()


def principal_answer(principal: Principal) -> dict[str, Any]:
    answer = PrincipalAnswer(
        subject=principal.subject,
        role=principal.role,
        scopes=sorted(principal.scopes),
        name=principal.name,
    )
    return answer.to_wire()


def actions_answer(page: InboxPage) -> dict[str, Any]:
    # The cursor is the last thread read (opaque to clients), whatever `assigned` kept.
    return {
        "actions": [item for entry in page.entries for item in entry.to_wire()],
        "next_cursor": page.next_cursor,
    }
