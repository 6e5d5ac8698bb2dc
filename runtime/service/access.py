"""The permission policy applied to one thread: the authors of everything a command touches, and
refusals that say why."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from runtime.domain import InputPolicy, MessageRole, Principal, Run, RunStatus, Snapshot
from runtime.errors import Forbidden, NotFound
from runtime.service.assigned import decide_map
from runtime.service.permissions import Destructive, PermissionPolicy
from runtime.storage.decisions import MessageRef, plan_truncate
from runtime.storage.store import Store

_AUTHORED = (Destructive.REGENERATE, Destructive.VISIBILITY)
_RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


class AccessControl:
    """Enforces a `PermissionPolicy` over a command's effects, not only the object it names:
    the rule must allow the caller for the author of every message it deletes or hides, every
    run it cancels or re-answers and every queued item it withdraws. Authors are read only when
    a rule needs them: a message's author is whoever started the run that wrote it (assistant
    and tool messages) or submitted it (user messages, `Store.message_authors`)."""

    def __init__(self, store: Store, policy: PermissionPolicy) -> None:
        self.store = store
        self.policy = policy

    def open_to(self, principal: Principal, action: Destructive) -> bool:
        """Whether `principal` may do `action` whoever the authors are (no lookup needed)."""
        return not self.policy.needs_author(action) and self.policy.allows(action, principal, None)

    def require(
        self, principal: Principal, action: Destructive, authors: Collection[str | None]
    ) -> None:
        """Refuse `action` unless the policy allows `principal` over every one of `authors`
        (the authors of what it changes; an unknown author is None and only the roles the
        rule admits whoever wrote it pass)."""
        if all(self.policy.allows(action, principal, a) for a in authors or (None,)):
            return
        rule = self.policy.rule(action)
        what = action.value.replace("_", " ")
        raise Forbidden(
            f"this deployment lets only {rule.value!r} principals {what} here",
            action=action.value,
            rule=rule.value,
        )

    # --- checks before a destructive command (under the thread's admin lease for rewrites) ---

    async def require_regenerate(
        self, principal: Principal, thread_id: str, from_message_id: str
    ) -> None:
        """Every message the truncation deletes, and the user message the new run answers."""
        if self.open_to(principal, Destructive.REGENERATE):
            return
        messages = await self.store.list_messages(thread_id)
        plan = plan_truncate(
            [MessageRef(m.id, m.position, m.role) for m in messages], from_message_id
        )
        touched = [*plan.removed_ids, plan.input_message_id]
        authors = await self.store.message_authors(thread_id, touched)
        self.require(principal, Destructive.REGENERATE, [authors.get(i) for i in touched])

    async def require_retry(self, principal: Principal, thread_id: str, run: Run) -> None:
        """Retry follows the `regenerate` rule: the retried run (its messages go, its input is
        answered by a new run) and its input message."""
        if self.open_to(principal, Destructive.REGENERATE):
            return
        authors: list[str | None] = [run.started_by]
        if run.input_message_id is not None:
            found = await self.store.message_authors(thread_id, [run.input_message_id])
            authors.append(found.get(run.input_message_id))
        self.require(principal, Destructive.REGENERATE, authors)

    async def require_visibility(
        self, principal: Principal, thread_id: str, message_id: str
    ) -> None:
        if self.open_to(principal, Destructive.VISIBILITY):
            return
        authors = await self.store.message_authors(thread_id, [message_id])
        if message_id not in authors and not any(
            m.id == message_id for m in await self.store.list_messages(thread_id)
        ):
            raise NotFound(f"message {message_id} not found")
        self.require(principal, Destructive.VISIBILITY, [authors.get(message_id)])

    async def require_cancel_queued(
        self, principal: Principal, thread_id: str, item_id: str
    ) -> None:
        if self.open_to(principal, Destructive.CANCEL_QUEUED):
            return
        await self.store.get_thread(thread_id, principal.scopes)
        items = {item.id: item for item in await self.store.list_queue(thread_id)}
        if item_id not in items:
            raise NotFound(f"queued item {item_id} not found")
        self.require(principal, Destructive.CANCEL_QUEUED, [items[item_id].submitted_by])

    async def require_stop(self, principal: Principal, thread_id: str, run_id: str) -> None:
        if self.open_to(principal, Destructive.STOP):
            return
        await self.store.get_thread(thread_id, principal.scopes)
        run = await self.store.get_run(run_id)  # NotFound for an unknown run
        if run.thread_id != thread_id:
            raise NotFound(f"run {run_id} not found")
        self.require(principal, Destructive.STOP, [run.started_by])

    async def admit_policy(
        self, principal: Principal, thread_id: str, policy: InputPolicy
    ) -> InputPolicy:
        """`interrupt` stops the active run, so it follows the `stop` rule over that run's
        author. With no active run it behaves as `enqueue` would (it starts a run), and is sent
        as `enqueue`: a run that starts meanwhile is then queued behind, never stopped."""
        if policy is not InputPolicy.INTERRUPT or self.open_to(principal, Destructive.STOP):
            return policy
        await self.store.get_thread(thread_id, principal.scopes)
        active = await self.store.active_run(thread_id)
        if active is None:
            return InputPolicy.ENQUEUE
        self.require(principal, Destructive.STOP, [active.started_by])
        return policy

    # --- what a reader may do ----------------------------------------------------------------

    async def annotate(self, principal: Principal, snapshot: Snapshot) -> Snapshot:
        """The snapshot with what this reader may do, so clients offer only those actions."""
        policy = self.policy
        thread_id = snapshot.thread.id
        authors: dict[str, str] = {}
        if any(policy.needs_author(action) for action in _AUTHORED):
            # The snapshot's messages only, so a bounded snapshot stays bounded.
            ids = [m.id for m in snapshot.messages]
            authors = await self.store.message_authors(thread_id, ids)

        def may(action: Destructive, *of: str | None) -> bool:
            return all(policy.allows(action, principal, author) for author in of)

        run = snapshot.run
        run_author = None if run is None else run.started_by
        reply = last_assistant_reply_start(snapshot.messages)
        # Regenerating the latest reply deletes it and what follows and re-answers the user
        # message before it: everything after the second-to-last boundary.
        redone = _from_user_before(snapshot.messages, reply)
        retry = False
        if run is not None and run.status in _RETRYABLE:
            input_author = None
            if policy.needs_author(Destructive.REGENERATE):
                input_author = await self._input_author(thread_id, run.id, authors)
            retry = may(Destructive.REGENERATE, run_author, input_author)
        permissions = {
            "policy": policy.model_dump(mode="json"),
            "regenerate": reply is not None
            and may(Destructive.REGENERATE, *(authors.get(i) for i in redone)),
            "retry": retry,
            "stop": run is not None and may(Destructive.STOP, run_author),
            "cancel_queued": [
                item.id
                for item in snapshot.queue
                if may(Destructive.CANCEL_QUEUED, item.submitted_by)
            ],
            "visibility": [
                m.id for m in snapshot.messages if may(Destructive.VISIBILITY, authors.get(m.id))
            ],
            "decide": decide_map(principal, snapshot.pending_actions),
        }
        return snapshot.model_copy(update={"permissions": permissions})

    async def _input_author(self, thread_id: str, run_id: str, known: dict[str, str]) -> str | None:
        """The author of the message a run answers (`known` first: the snapshot's authors)."""
        input_id = (await self.store.get_run(run_id)).input_message_id
        if input_id is None:
            return None
        if input_id not in known:
            known = await self.store.message_authors(thread_id, [input_id])
        return known.get(input_id)


def last_assistant_reply_start(messages: Sequence[Any]) -> str | None:
    """The first message after the last user message, if it is the assistant's reply."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is MessageRole.USER:
            return messages[index + 1].id if index + 1 < len(messages) else None
    return None


def _from_user_before(messages: Sequence[Any], reply: str | None) -> Iterable[str]:
    """The ids from the user message before `reply` to the end (empty without a reply)."""
    ids = [m.id for m in messages]
    if reply is None:
        return ()
    return ids[ids.index(reply) - 1 :]


__all__ = ["AccessControl", "last_assistant_reply_start"]
