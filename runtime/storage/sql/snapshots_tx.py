"""Snapshot reads: the committed state of a thread as its viewers see it, whole or one page
of its messages, read in one transaction so every part is at the same version (Postgres reads
the bounded one in one statement instead: `snapshot_statement`, through `page_snapshot`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from runtime.domain import (
    Message,
    QueuedItem,
    QueuedItemView,
    Run,
    RunView,
    Snapshot,
    Thread,
    ThreadView,
    Visibility,
    pending_actions_of,
)
from runtime.storage.sql.core import Conn, thread_row
from runtime.storage.sql.decoded_messages import SNAPSHOT_MESSAGES
from runtime.storage.sql.rows import Row, thread_from_row
from runtime.storage.sql.threads_tx import latest_run, messages, queued_items, tail_row


async def snapshot(
    conn: Conn,
    thread_id: str,
    scopes: Collection[str],
    include_hidden: bool,
    message_limit: int | None = None,
    before: int | None = None,
) -> Snapshot:
    # Called in one read transaction: every part of the snapshot is at the same version.
    thread = thread_from_row(await thread_row(conn, thread_id, scopes))
    if message_limit is not None:
        return await _bounded_snapshot(conn, thread, include_hidden, message_limit, before)
    return build_snapshot(
        thread,
        await messages(conn, thread_id),
        await latest_run(conn, thread_id),
        await queued_items(conn, thread_id),
        include_hidden=include_hidden,
    )


async def _bounded_snapshot(
    conn: Conn, thread: Thread, include_hidden: bool, limit: int, before: int | None
) -> Snapshot:
    """The last `limit` messages (before position `before`), read by index: cost does not
    grow with the thread's length. Pending actions still come from the real tail."""
    visible = "" if include_hidden else " AND visibility = 'visible'"
    older = "" if before is None else " AND position < $3"
    args: list[Any] = [thread.id, limit + 1] + ([] if before is None else [before])
    rows = await conn.fetch(
        f"SELECT * FROM messages WHERE thread_id = $1{visible}{older}"
        " ORDER BY position DESC LIMIT $2",
        *args,
    )
    return page_snapshot(
        thread,
        rows,
        await tail_row(conn, thread.id),
        await latest_run(conn, thread.id),
        await queued_items(conn, thread.id),
        limit,
    )


def page_snapshot(
    thread: Thread,
    newest_first: Sequence[Row],
    tail: Row | None,
    run: Run | None,
    queue: list[QueuedItem],
    limit: int,
) -> Snapshot:
    """A bounded snapshot from its rows: up to `limit + 1` messages newest first (one more
    than the page says there are older ones), the thread's last message of any visibility,
    its latest run and queued items."""
    decoded = SNAPSHOT_MESSAGES.message
    page = [decoded(row) for row in reversed(newest_first[:limit])]
    built = build_snapshot(
        thread,
        page,
        run,
        queue,
        include_hidden=True,  # filtered by the query already
    )
    cursor = page[0].position if len(newest_first) > limit and page else None
    tail_message = decoded(tail) if tail is not None else None
    actions = tuple(pending_actions_of(tail_message)) if tail_message is not None else ()
    return built.model_copy(
        update={"pending_actions": actions, "page": {"limit": limit, "before": cursor}}
    )


def build_snapshot(
    thread: Thread,
    messages: list[Message],
    run: Run | None,
    queue: list[QueuedItem],
    *,
    include_hidden: bool = False,
) -> Snapshot:
    """Project committed rows: public metadata only, visible messages (hidden ones too when
    asked, marked by their visibility), tail pending actions."""
    tail = messages[-1] if messages else None
    view = SNAPSHOT_MESSAGES.view
    return Snapshot(
        thread=ThreadView.of(thread),
        messages=tuple(
            view(message)
            for message in messages
            if include_hidden or message.visibility is Visibility.VISIBLE
        ),
        pending_actions=tuple(pending_actions_of(tail)) if tail is not None else (),
        run=None
        if run is None
        else RunView(
            id=run.id,
            status=run.status,
            error=run.error,
            started_by=run.started_by,
            next_seq=run.next_seq,
        ),
        queue=tuple(
            QueuedItemView(
                id=item.id, text=item.text, submitted_by=item.submitted_by, interrupt=item.interrupt
            )
            for item in queue
        ),
    )
