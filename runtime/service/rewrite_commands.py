"""The history-rewrite commands of `ThreadService` (regenerate, retry, visibility): each picks
its target, ties the rewrite to the version it read, and runs `rewrites.rewrite`."""

from __future__ import annotations

from runtime.domain import Principal, Visibility
from runtime.engine.publisher import Publisher
from runtime.errors import InvalidInput, NotFound
from runtime.lifecycle import AgentLifecycle
from runtime.service.access import AccessControl, last_assistant_reply_start
from runtime.service.rewrites import rewrite
from runtime.storage.decisions import check_retryable
from runtime.storage.store import RetryRun, RewriteResult, SetVisibility, Store, Truncate


class RewriteCommands:
    """Mixed into `ThreadService`, whose constructor sets these attributes."""

    store: Store
    publisher: Publisher
    lifecycle: AgentLifecycle
    owner: str
    access: AccessControl

    async def regenerate(
        self,
        principal: Principal,
        thread_id: str,
        message_id: str | None = None,
        *,
        expected_version: int | None = None,
    ) -> RewriteResult:
        """Delete `message_id` (default: the latest assistant reply) and what follows, and answer
        the user message before it again, as a new run of `principal`'s."""
        # The version first: what the messages show is at least as new, so a rewrite tied to it
        # refuses if anything (a send acknowledged meanwhile) committed after this read.
        read_version = (await self.store.get_thread(thread_id, principal.scopes)).version
        messages = await self.store.list_messages(thread_id)
        if message_id is None:
            target = last_assistant_reply_start(messages)
            if target is None:
                raise InvalidInput("there is no assistant reply to regenerate")
            message_id = target
        elif not any(m.id == message_id for m in messages):
            raise NotFound(f"message {message_id} not found")
        start = message_id
        return await rewrite(
            self,
            principal,
            thread_id,
            lambda version: Truncate(
                from_message_id=start, started_by=principal.subject, expected_version=version
            ),
            authorize=lambda: self.access.require_regenerate(principal, thread_id, start),
            kind="regenerate",
            message_id=message_id,
            expected_version=expected_version,
            read_version=read_version,
        )

    async def retry(
        self,
        principal: Principal,
        thread_id: str,
        run_id: str | None = None,
        *,
        expected_version: int | None = None,
    ) -> RewriteResult:
        """Answer the input of the thread's latest run again when that run failed or was
        cancelled: its messages go, a new run (trigger `retry`) starts, through both rewrite
        phases. `run_id`, when given, must name that latest run."""
        snapshot = await self.store.snapshot(thread_id, principal.scopes)
        latest = snapshot.run
        if latest is None:
            raise InvalidInput("the thread has no run to retry")
        target = run_id or latest.id
        check_retryable(target, latest.id, latest.status)
        run = await self.store.get_run(target)
        return await rewrite(
            self,
            principal,
            thread_id,
            lambda version: RetryRun(
                run_id=target, started_by=principal.subject, expected_version=version
            ),
            authorize=lambda: self.access.require_retry(principal, thread_id, run),
            kind="retry",
            message_id=run.input_message_id or "",
            expected_version=expected_version,
            read_version=snapshot.thread.version,
            retried_run_id=target,
        )

    async def set_visibility(
        self,
        principal: Principal,
        thread_id: str,
        message_id: str,
        visibility: Visibility,
        *,
        expected_version: int | None = None,
    ) -> RewriteResult:
        return await rewrite(
            self,
            principal,
            thread_id,
            lambda version: SetVisibility(
                message_id=message_id, visibility=visibility, expected_version=version
            ),
            authorize=lambda: self.access.require_visibility(principal, thread_id, message_id),
            kind="visibility",
            message_id=message_id,
            visibility=visibility,
            expected_version=expected_version,
        )


__all__ = ["RewriteCommands"]
