"""History rewrites (regenerate, retry, visibility): the permission check and both rewrite phases
around one versioned transaction under the thread's admin lease, then the new run's wakeup."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from runtime import instruments
from runtime.compose import HistoryRewrittenErrors
from runtime.domain import Principal, Visibility
from runtime.engine.publisher import Publisher
from runtime.errors import RunActive
from runtime.lifecycle import AgentLifecycle, RewriteContext, RewriteKind, RewriteOutcome
from runtime.storage.decisions import check_expected_version
from runtime.storage.store import RewriteOp, RewriteResult, Store

log = logging.getLogger(__name__)

ADMIN_LEASE_TTL = 10.0


class RewriteHost(Protocol):
    """What a rewrite runs with: the store, the bus, the composed hooks and the lease owner
    (ThreadService is one)."""

    @property
    def store(self) -> Store: ...
    @property
    def publisher(self) -> Publisher: ...
    @property
    def lifecycle(self) -> AgentLifecycle: ...
    @property
    def owner(self) -> str: ...


async def rewrite(
    host: RewriteHost,
    principal: Principal,
    thread_id: str,
    make_op: Callable[[int], RewriteOp],
    *,
    authorize: Callable[[], Awaitable[None]],
    kind: RewriteKind,
    message_id: str,
    visibility: Visibility | None = None,
    expected_version: int | None = None,
    read_version: int | None = None,
    retried_run_id: str | None = None,
) -> RewriteResult:
    """`authorize`, prepare_history_rewrite, the rewrite and its metadata patches in one
    transaction, then history_rewritten and the wakeup of the run the rewrite started.

    The thread is read under the admin lease and `make_op(version)` builds the op with the
    version read: the hook's patch is computed from metadata nobody can change before the
    commit, and the commit refuses if the thread moved on anyway (VersionMismatch, 409).
    `expected_version` is the caller's own precondition, checked against the same read.
    `read_version` is the version of the read the service chose the op's target from (the
    reply to regenerate, the run to retry), read before the lease: the rewrite is tied to it, so
    it cannot delete what was committed after that read, such as a send acknowledged meanwhile
    (VersionMismatch, 409 `conflict`, and nothing changes).
    `authorize` (the permission policy over what the op deletes, hides or re-answers) runs on
    that same read, before any hook: the commit's version check makes what it allowed exactly
    what is rewritten, and a refusal changes nothing."""
    store, publisher, lifecycle, owner = host.store, host.publisher, host.lifecycle, host.owner
    with instruments.span(
        "threadline.history_rewrite", **{"threadline.rewrite.kind": kind, "thread_id": thread_id}
    ) as span:
        before = await store.get_thread(thread_id, principal.scopes)  # NotFound outside scopes
        if await store.active_run(thread_id) is not None:
            raise RunActive("the thread has an active run; stop it before rewriting history")
        lease = await store.acquire_admin_lease(thread_id, owner, ADMIN_LEASE_TTL)
        if lease is None:
            raise RunActive("another history rewrite of this thread is in progress")
        try:
            # Read again under the lease: what the hook computes its patch from must be what the
            # rewrite commits over (`before` may be stale by now).
            thread = await store.get_thread(before.id, principal.scopes)
            check_expected_version(thread_id, thread.version, expected_version)
            check_expected_version(thread_id, thread.version, read_version)
            await authorize()
            ctx = RewriteContext(
                thread_id=thread_id,
                scope=thread.scope,
                kind=kind,
                message_id=message_id,
                requested_by=principal.subject,
                visibility=visibility,
                metadata=thread.metadata,
                private_metadata=thread.private_metadata,
                version=thread.version,
                retried_run_id=retried_run_id,
            )
            patch = await lifecycle.prepare_history_rewrite(ctx)
            result = await store.rewrite_history(
                lease,
                make_op(thread.version),
                dict(patch.public) if patch else None,
                dict(patch.private) if patch else None,
            )
        finally:
            await store.release_lease(lease)
        await publisher.invalidate(thread_id, result.version)
        outcome = RewriteOutcome(
            thread_id=thread_id,
            version=result.version,
            kind=kind,
            message_id=message_id,
            run_id=result.run_id,
            removed_message_ids=result.removed_message_ids,
        )
        span.set_attribute("threadline.rewrite.id", outcome.rewrite_id)
        try:
            await lifecycle.history_rewritten(ctx, outcome)
        except HistoryRewrittenErrors as errors:
            # Best effort after commit: reported where a reconciler can find it, never undone.
            log.warning(
                "history_rewritten observers failed for rewrite %s: %s",
                outcome.rewrite_id,
                errors.exceptions,
            )
            span.add_event(
                "history_rewritten.failed",
                {
                    "threadline.rewrite.id": outcome.rewrite_id,
                    "threadline.rewrite.kind": kind,
                    "threadline.rewrite.failures": len(errors.exceptions),
                    "error.type": [type(exc).__name__ for exc in errors.exceptions],
                },
            )
            instruments.safe_add(
                instruments.HISTORY_REWRITTEN_FAILURES,
                len(errors.exceptions),
                {"threadline.rewrite.kind": kind},
            )
        if result.run_id:
            # Woken after the observers ran: they see the rewrite before the new run starts.
            await publisher.wakeup(result.run_id, thread_id)
        return result
