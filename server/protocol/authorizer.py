"""The deployment's authorization hook, asked once per command by the command table before any
effect: the request it is asked (`Authorization`), and what its decision does."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.authorization import (
    FORBIDDEN_BY_POLICY,
    AccessKind,
    Allow,
    Authorization,
    AuthorizeHook,
    Decision,
    Deny,
    Narrow,
    ThreadMatch,
    ThreadResource,
)
from runtime.domain import Origin, Principal, Thread
from runtime.errors import Forbidden, NotFound
from runtime.service.client_threads import client_thread_id
from runtime.storage.store import ThreadStore

log = logging.getLogger(__name__)

# What each command does, for hooks that decide by kind; administration (schedules, webhooks,
# tokens) by its prefix, even when it names a thread; any other thread-bound command is a write.
ADMIN_PREFIXES = ("schedule.", "webhook.", "delivery.", "token.")
ACTIONS: dict[str, AccessKind] = {
    "thread.create": AccessKind.CREATE,
    "thread.list": AccessKind.LIST,
    "actions.list": AccessKind.LIST,
    "actions.subscribe": AccessKind.LIST,
    "thread.snapshot": AccessKind.READ,
    "queue.item": AccessKind.READ,
    "subscribe": AccessKind.READ,
    "presence.update": AccessKind.READ,  # live state of a watcher's, never stored
    "thread.open": AccessKind.READ,  # CREATE when the client id names no thread yet
    "unsubscribe": AccessKind.SESSION,
    "actions.unsubscribe": AccessKind.SESSION,
    "ping": AccessKind.SESSION,
    "me": AccessKind.SESSION,
}
# Lists whose answer a `Narrow` filters (the store applies it; the live inbox frame by frame);
# elsewhere it is a condition on the thread the command names (none named: nothing to narrow).
NARROWED = frozenset({"thread.list", "actions.list", "actions.subscribe"})


class ForbiddenByPolicy(Forbidden):
    """The authorization hook's refusal (HTTP 403), with the code the hook chose."""

    code = FORBIDDEN_BY_POLICY

    def __init__(self, message: str, code: str = FORBIDDEN_BY_POLICY) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Authorizer:
    """Runs a deployment's hook (sync or async) for a command, and applies its decision.

    `admit` answers the narrowing a list applies (None: no narrowing) or raises
    `ForbiddenByPolicy`; a thread the caller's scopes do not hold is `not_found` first, as the
    command itself would answer, so the hook never learns about foreign threads."""

    hook: AuthorizeHook
    store: ThreadStore

    async def admit(
        self,
        principal: Principal,
        command: str,
        data: Any,
        origin: Origin | None = None,
        pending: dict[str, ThreadResource] | None = None,
    ) -> tuple[ThreadMatch, ...] | None:
        """Ask the hook about `command` with input `data`. `pending` holds the threads earlier
        steps of the same request create (an event-stream request opening a new thread): a
        creation admitted here is added to it, so the steps after it see their thread."""
        pending = {} if pending is None else pending
        thread, new = await self.resource(principal, command, data, pending)
        action = ACTIONS.get(command)
        if new:
            action = AccessKind.CREATE
        elif action is None:
            admin = command.startswith(ADMIN_PREFIXES) or _thread_id(data) is None
            action = AccessKind.ADMIN if admin else AccessKind.WRITE
        request = Authorization(
            principal=principal,
            command=command,
            action=action,
            thread=thread,
            transport=None if origin is None else origin.transport,
        )
        decision = await self.decide(request)
        if isinstance(decision, Deny):
            raise ForbiddenByPolicy(decision.message, decision.code)
        narrowing = None
        if isinstance(decision, Narrow):
            if command in NARROWED:
                narrowing = decision.any_of
            elif thread is not None and not decision.matches(thread):
                raise ForbiddenByPolicy(decision.message)
        if new and thread is not None and thread.id is not None:
            pending[thread.id] = thread
        return narrowing

    async def decide(self, request: Authorization) -> Decision:
        """The hook's decision; a hook that fails or answers something else denies (logged):
        a broken policy must never open a door, nor answer 500."""
        try:
            decision: Any = self.hook(request)
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception:
            log.exception("the authorization hook failed on %s", request.command)
            return Deny("the authorization hook failed; refused")
        if not isinstance(decision, Allow | Deny | Narrow):
            log.error("the authorization hook answered %r, not a decision", decision)
            return Deny("the authorization hook gave no decision; refused")
        return decision

    async def resource(
        self,
        principal: Principal,
        command: str,
        data: Any,
        pending: Mapping[str, ThreadResource],
    ) -> tuple[ThreadResource | None, bool]:
        """The thread `data` names, and whether the command creates it."""
        if command == "thread.create":
            # A token of several scopes must name one (the command refuses it otherwise).
            only = next(iter(principal.scopes)) if len(principal.scopes) == 1 else ""
            scope = data.scope or only
            return ThreadResource(None, scope, principal.subject, dict(data.metadata or {})), True
        if command == "thread.open":
            return await self._client_thread(principal, data.thread_id, data.create, pending)
        thread_id = _thread_id(data)
        if thread_id is None:
            return None, False
        if thread_id in pending:
            return pending[thread_id], False
        return _resource(await self.store.get_thread(thread_id, principal.scopes)), False

    async def _client_thread(
        self,
        principal: Principal,
        client_id: str,
        create: bool,
        pending: Mapping[str, ThreadResource],
    ) -> tuple[ThreadResource | None, bool]:
        """The thread a client id names (as `open_client_thread` finds it), or the one it
        creates in the caller's scope (owned by the caller, no metadata)."""
        scopes = sorted(principal.scopes)
        for thread_id in [client_id, *(client_thread_id(s, client_id) for s in scopes)]:
            if thread_id in pending:
                return pending[thread_id], False
            try:
                return _resource(await self.store.get_thread(thread_id, principal.scopes)), False
            except NotFound:
                continue
        if not create or len(scopes) != 1:
            return None, False  # the command answers (nothing to open, or which scope?)
        thread_id = client_thread_id(scopes[0], client_id)
        return ThreadResource(thread_id, scopes[0], principal.subject, {}), True


def _resource(thread: Thread) -> ThreadResource:
    return ThreadResource(thread.id, thread.scope, thread.owner, thread.metadata)


def _thread_id(data: Any) -> str | None:
    value = getattr(data, "thread_id", None)
    return value if isinstance(value, str) else None


__all__ = ["ACTIONS", "NARROWED", "Authorizer", "ForbiddenByPolicy"]
