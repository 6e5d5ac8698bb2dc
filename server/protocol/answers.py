"""Answer bodies of commands, shared by the HTTP routes and websocket acks so both say the same."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

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

T = TypeVar("T")


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


def next_cursor(items: Sequence[T], limit: int | None, cursor: Callable[[T], str]) -> str | None:
    """The cursor after a page's last item when the page is full (more may be behind it);
    None: this was the last page."""
    full = limit is not None and bool(items) and len(items) >= limit
    return cursor(items[-1]) if full else None


def threads_answer(threads: list[Thread], limit: int | None = None) -> dict[str, Any]:
    # Private metadata never leaves the server.
    page = ThreadPage(
        next_cursor=next_cursor(threads, limit, page_cursor),
        threads=[
            # The wire model's fields only: nothing internal leaves by being added to Thread.
            ThreadInfo.model_validate(thread.model_dump(include=set(ThreadInfo.model_fields)))
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
