"""The permission policy applied to one thread: who wrote what, and refusals that say why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.domain import MessageRole, Principal, Snapshot
from runtime.errors import Forbidden, NotFound
from runtime.service.permissions import Destructive, PermissionPolicy
from runtime.storage.store import Store

_AUTHORED = (Destructive.REGENERATE, Destructive.VISIBILITY)


class AccessControl:
    """Enforces a `PermissionPolicy` for the service, reading authors only when a rule needs
    them: the author of a message is whoever started the run that wrote it (assistant and tool
    messages) or that it started (user messages)."""

    def __init__(self, store: Store, policy: PermissionPolicy) -> None:
        self.store = store
        self.policy = policy

    # --- checks before a destructive command -----------------------------------------------

    async def require(
        self,
        principal: Principal,
        action: Destructive,
        thread_id: str,
        author: str | None = None,
        message_id: str | None = None,
    ) -> None:
        """Refuse `action` unless the policy allows it to `principal`."""
        if message_id is not None and self.policy.needs_author(action):
            messages = await self.store.list_messages(thread_id)
            author = (await self._authors_of(messages)).get(message_id)
        if not self.policy.allows(action, principal, author):
            rule = self.policy.rule(action)
            what = action.value.replace("_", " ")
            raise Forbidden(
                f"this deployment lets only {rule.value!r} principals {what} here",
                action=action.value,
                rule=rule.value,
            )

    def open_to(self, principal: Principal, action: Destructive) -> bool:
        """Whether `principal` may do `action` whoever the author is (no lookup needed)."""
        return not self.policy.needs_author(action) and self.policy.allows(action, principal, None)

    async def require_cancel_queued(
        self, principal: Principal, thread_id: str, item_id: str
    ) -> None:
        if self.open_to(principal, Destructive.CANCEL_QUEUED):
            return
        await self.store.get_thread(thread_id, principal.scopes)
        items = {item.id: item for item in await self.store.list_queue(thread_id)}
        if item_id not in items:
            raise NotFound(f"queued item {item_id} not found")
        author = items[item_id].submitted_by
        await self.require(principal, Destructive.CANCEL_QUEUED, thread_id, author)

    async def require_stop(self, principal: Principal, thread_id: str, run_id: str) -> None:
        if self.open_to(principal, Destructive.STOP):
            return
        await self.store.get_thread(thread_id, principal.scopes)
        run = await self.store.get_run(run_id)  # NotFound for an unknown run
        if run.thread_id != thread_id:
            raise NotFound(f"run {run_id} not found")
        await self.require(principal, Destructive.STOP, thread_id, run.started_by)

    # --- what a reader may do ----------------------------------------------------------------

    async def annotate(self, principal: Principal, snapshot: Snapshot) -> Snapshot:
        """The snapshot with what this reader may do, so clients offer only those actions."""
        policy = self.policy
        authors: dict[str, str] = {}
        if any(policy.needs_author(action) for action in _AUTHORED):
            # The snapshot's messages only, so a bounded snapshot stays bounded.
            authors = await self._authors_of(snapshot.messages)

        def may(action: Destructive, author: str | None) -> bool:
            return policy.allows(action, principal, author)

        run = snapshot.run
        run_author = None
        if run is not None and policy.needs_author(Destructive.STOP):
            run_author = (await self.store.get_run(run.id)).started_by
        reply = last_assistant_reply_start(snapshot.messages)
        permissions = {
            "policy": policy.model_dump(mode="json"),
            "regenerate": reply is not None and may(Destructive.REGENERATE, authors.get(reply)),
            "stop": run is not None and may(Destructive.STOP, run_author),
            "cancel_queued": [
                item.id
                for item in snapshot.queue
                if may(Destructive.CANCEL_QUEUED, item.submitted_by)
            ],
            "visibility": [
                m.id for m in snapshot.messages if may(Destructive.VISIBILITY, authors.get(m.id))
            ],
        }
        return snapshot.model_copy(update={"permissions": permissions})

    async def _authors_of(self, messages: Sequence[Any]) -> dict[str, str]:
        runs = {}
        for run_id in {m.run_id for m in messages if m.run_id}:
            runs[run_id] = await self.store.get_run(run_id)
        by_input = {run.input_message_id: run.started_by for run in runs.values()}
        authors: dict[str, str] = {}
        for message in messages:
            if message.run_id in runs:
                authors[message.id] = runs[message.run_id].started_by
            elif message.id in by_input:
                authors[message.id] = by_input[message.id]
        return authors


def last_assistant_reply_start(messages: Sequence[Any]) -> str | None:
    """The first message after the last user message, if it is the assistant's reply."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is MessageRole.USER:
            return messages[index + 1].id if index + 1 < len(messages) else None
    return None


__all__ = ["AccessControl", "last_assistant_reply_start"]
