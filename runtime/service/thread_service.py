"""Thread commands on behalf of a principal: the runtime's public face for HTTP and websocket."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from runtime.agent import Agent
from runtime.approvals import ApprovalDecision, check_eligible
from runtime.authorization import AuthorizeHook, ThreadMatch
from runtime.compose import compose_lifecycle
from runtime.domain import (
    Admission,
    InputPolicy,
    Origin,
    Principal,
    Resolution,
    Role,
    Snapshot,
    Thread,
    ToolCallPart,
    WaitKind,
)
from runtime.engine.publisher import Publisher
from runtime.errors import Forbidden, InvalidInput, NotFound
from runtime.service.access import AccessControl
from runtime.service.assigned import InboxPage, inbox_page
from runtime.service.payloads import check_payload
from runtime.service.permissions import PermissionPolicy
from runtime.service.rewrite_commands import RewriteCommands
from runtime.storage.store import (
    AdmissionLimits,
    ResolveResult,
    StopResult,
    Store,
)
from runtime.storage.thread_query import ThreadQuery
from runtime.tools import client_tools_from

log = logging.getLogger(__name__)

# Roles that may post manual tool results (and other operations for trusted backends).
TRUSTED_ROLES = frozenset({Role.BACKEND, Role.ADMIN})


# Where each kind of action is resolved (the generic resume takes approvals only).
_RESULT_ROUTES = {WaitKind.CLIENT_TOOL: "client-result", WaitKind.MANUAL_RESULT: "manual-result"}


def require_trusted(principal: Principal) -> None:
    """Refuse a principal that is not a backend actor or an admin.

    Decided here, not in the transports, so HTTP and websocket cannot disagree. It needs no
    lookup, so adapters may ask it before reading a body: a 403 never reveals whether a thread
    exists, nor depends on the body.
    """
    if principal.role not in TRUSTED_ROLES:
        raise Forbidden(f"role {principal.role} may not do this; backend or admin required")


def field_errors(items: Iterable[tuple[Iterable[Any], str]]) -> list[dict[str, Any]]:
    """`[{"loc": [...], "msg": ...}]`, the one shape of field errors on every error body."""
    return [{"loc": [str(part) for part in loc], "msg": msg} for loc, msg in items]


def validation_field_errors(exc: ValidationError, *, skip: int = 0) -> list[dict[str, Any]]:
    """Field errors of a pydantic error; `skip` drops leading loc parts (a union's tag)."""
    return field_errors((err["loc"][skip:], err["msg"]) for err in exc.errors())


class ThreadService(RewriteCommands):
    """Validates and applies commands; every write commits in storage, then publishes.

    Deny by default: every call filters by the principal's scopes, so a foreign thread is
    `NotFound`, exactly like a missing one.
    """

    # The deployment's authorization hook (docs/authorization.md), which the command table asks
    # before every command; None: today's scope and permission rules alone.
    authorize_hook: AuthorizeHook | None = None

    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        agent: Agent,
        *,
        limits: AdmissionLimits | None = None,
        permissions: PermissionPolicy | None = None,
        snapshot_messages: int | None = None,
        queue_preview_chars: int | None = None,
        authorize_hook: AuthorizeHook | None = None,
    ) -> None:
        self.store = store
        self.authorize_hook = authorize_hook
        # Bounded snapshots: the last `snapshot_messages` messages, queued texts cut to a preview.
        self.snapshot_messages = snapshot_messages
        self.queue_preview_chars = queue_preview_chars
        self.permissions = permissions or PermissionPolicy()
        self.access = AccessControl(store, self.permissions)
        # Queue and per-scope run bounds, checked by the store inside the admission transaction.
        self.limits = limits
        self.publisher = publisher
        self.agent = agent
        self.lifecycle = compose_lifecycle(agent.lifecycle)
        self.owner = f"svc-{uuid.uuid4().hex[:8]}"

    # --- reads ---------------------------------------------------------------------------

    async def create_thread(
        self,
        principal: Principal,
        *,
        title: str = "",
        metadata: Mapping[str, Any] | None = None,
        scope: str | None = None,
    ) -> Snapshot:
        target = scope or _default_scope(principal)
        if not principal.can_access(target):
            raise Forbidden(f"you may not create threads in scope {target!r}")
        thread = await self.store.create_thread(
            target, title, dict(metadata or {}), owner=principal.subject
        )
        self.publisher.known_scope(thread.id, thread.scope)
        # Nobody knows its id yet, so nothing else is in it: its first snapshot needs no read.
        committed = Snapshot.of_new_thread(thread, self.snapshot_messages)
        return await self.view_snapshot(principal, committed)

    async def rename_thread(self, principal: Principal, thread_id: str, title: str) -> Thread:
        """A new title. The rule of creating a thread: any principal of its scope (the title is
        no one's history, and a thread has no author for `PermissionPolicy` to ask about)."""
        thread = await self.store.rename_thread(thread_id, principal.scopes, title)
        await self.publisher.invalidate(thread_id, thread.version)
        return thread

    async def update_metadata(
        self, principal: Principal, thread_id: str, patch: dict[str, Any]
    ) -> Thread:
        """Merge `patch` into the public metadata; the rule of a rename (any principal of the
        thread's scope: metadata describes the thread, it is no one's history)."""
        thread = await self.store.update_metadata(thread_id, principal.scopes, patch)
        await self.publisher.invalidate(thread_id, thread.version)
        return thread

    async def list_threads(
        self, principal: Principal, limit: int = 100, query: ThreadQuery | None = None
    ) -> list[Thread]:
        return await self.store.list_threads(principal.scopes, limit, query)

    async def pending_actions(
        self,
        principal: Principal,
        limit: int = 100,
        after: str | None = None,
        *,
        assigned: bool = False,
        allowed: Sequence[ThreadMatch] | None = None,
    ) -> InboxPage:
        """The scope-wide inbox: pending actions of the principal's threads (one entry per
        thread, at most `limit`, by thread id after the cursor `after`); with `assigned`, only
        the actions the principal may decide now (its role, the policy's deciders, not the
        requester under four-eyes, not one it decided already); of the threads matching
        `allowed` when an authorization hook narrowed it."""
        entries = await self.store.pending_actions(
            principal.scopes, limit=limit, after=after, allowed=allowed
        )
        return inbox_page(principal, entries, limit, assigned)

    async def snapshot(
        self,
        principal: Principal,
        thread_id: str,
        *,
        include_hidden: bool = False,
        before: int | None = None,
        limit: int | None = None,
    ) -> Snapshot:
        """The thread as this principal sees it; bounded when the service is configured so
        (the last messages, `page.before` the cursor of older ones; queued texts previewed)."""
        committed = await self.committed_snapshot(
            principal, thread_id, include_hidden=include_hidden, before=before, limit=limit
        )
        return await self.view_snapshot(principal, committed)

    async def committed_snapshot(
        self,
        principal: Principal,
        thread_id: str,
        *,
        include_hidden: bool = False,
        before: int | None = None,
        limit: int | None = None,
    ) -> Snapshot:
        """`snapshot`'s storage read: the same for every principal who may read the thread
        (its scope among theirs), before `view_snapshot` makes it one principal's."""
        return await self.store.snapshot(
            thread_id,
            principal.scopes,
            include_hidden=include_hidden,
            message_limit=limit or self.snapshot_messages,
            before=before,
        )

    async def view_snapshot(self, principal: Principal, committed: Snapshot) -> Snapshot:
        """A committed snapshot as `principal` sees it: queue previews, what they may do."""
        return await self.access.annotate(principal, self._preview_queue(committed))

    def _preview_queue(self, snapshot: Snapshot) -> Snapshot:
        cap = self.queue_preview_chars
        if cap is None or all(len(item.text) <= cap for item in snapshot.queue):
            return snapshot
        queue = tuple(
            item
            if len(item.text) <= cap
            else item.model_copy(
                update={"text": item.text[:cap], "truncated": True, "size": len(item.text)}
            )
            for item in snapshot.queue
        )
        return snapshot.model_copy(update={"queue": queue})

    async def queued_item(self, principal: Principal, thread_id: str, item_id: str) -> Any:
        """One queued item with its full text (a snapshot carries only a preview)."""
        await self.store.get_thread(thread_id, principal.scopes)
        for item in await self.store.list_queue(thread_id):
            if item.id == item_id:
                return item
        raise NotFound(f"queued item {item_id} not found")

    # --- input ---------------------------------------------------------------------------

    async def send_message(
        self,
        principal: Principal,
        thread_id: str,
        text: str,
        *,
        client_request_id: str | None = None,
        policy: InputPolicy = InputPolicy.ENQUEUE,
        client_tools: Sequence[Mapping[str, Any]] = (),
    ) -> Admission:
        tools = self.client_tools(client_tools)
        policy = await self.access.admit_policy(principal, thread_id, policy)
        admission = await self.store.submit_input(
            thread_id,
            principal.scopes,
            text=text,
            submitted_by=principal.subject,
            client_request_id=client_request_id,
            policy=policy,
            client_tools=tools,
            limits=self.limits,
        )
        if admission.duplicate:
            return admission
        await self.publisher.invalidate(
            thread_id,
            admission.version,
            stop=admission.interrupted_run_id or None,
            wakeup=admission.run_id or None,
        )
        return admission

    def client_tools(self, client_tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A message's client tool definitions, validated, named apart from the agent's."""
        try:
            tools = [t.model_dump() for t in client_tools_from(client_tools)]
        except ValidationError as exc:
            errors = validation_field_errors(exc)
            raise InvalidInput("invalid client tool definition", errors=errors) from exc
        _check_client_tool_names(self.agent, [t["name"] for t in tools])
        return tools

    async def cancel_queued(self, principal: Principal, thread_id: str, item_id: str) -> int:
        await self.access.require_cancel_queued(principal, thread_id, item_id)
        version = await self.store.cancel_queued_item(thread_id, principal.scopes, item_id)
        await self.publisher.invalidate(thread_id, version)
        return version

    # --- pending actions -----------------------------------------------------------------

    async def resume_action(
        self,
        principal: Principal,
        thread_id: str,
        action_id: str,
        payload: Mapping[str, Any],
        *,
        expected_version: int | None = None,
        kind: WaitKind | None = None,
        origin: Origin | None = None,
    ) -> ResolveResult:
        """Validate `payload` once, with the tool's own payload model (and a submitted result's
        output with the tool's output model), then compare-and-set its resolution.

        `kind` is the kind of action the route resolves: client and manual results have routes
        of their own (manual results for trusted roles only, refused before any lookup), so the
        generic resume (`kind` None) resolves approvals only and cannot walk around them.
        """
        await self.check_resume(principal, thread_id, action_id, payload, kind=kind)
        resolution = await self.resolution(principal, thread_id, action_id, payload, kind, origin)
        # The store re-checks everything atomically: a concurrent winner makes this a conflict.
        result = await self.store.resolve_action(
            thread_id, principal.scopes, action_id, resolution, expected_version
        )
        await self.publisher.invalidate(
            thread_id,
            result.version,
            wakeup=result.run_id if result.run_resumed and result.run_id else None,
        )
        return result

    async def check_resume(
        self,
        principal: Principal,
        thread_id: str,
        action_id: str,
        payload: Mapping[str, Any],
        *,
        kind: WaitKind | None = None,
    ) -> None:
        """Everything `resume_action` checks before its compare-and-set, changing nothing: a
        request of several commands checks each before the first commits. An action that is
        not pending passes: its resolution is refused by the store (conflict, naming who won)."""
        if kind is WaitKind.MANUAL_RESULT:
            require_trusted(principal)
        part = await self._pending_part(principal, thread_id, action_id)
        if part is not None and part.waiting is not None:
            if principal.role not in part.waiting.allowed_roles:
                raise Forbidden(f"role {principal.role} may not resolve this action")
            # The generic resume (`kind` None) resolves approvals only: client and manual
            # results have routes (and rules) of their own that it must not walk around.
            wanted = kind or WaitKind.APPROVAL
            if part.waiting.kind is not wanted:
                route = _RESULT_ROUTES.get(part.waiting.kind, "resume")
                raise InvalidInput(
                    f"action {action_id} is a {part.waiting.kind} action, not {wanted}:"
                    f" post it to …/actions/{action_id}/{route}",
                    kind=part.waiting.kind.value,
                )
            check_payload(self.agent, part, payload)
            if part.waiting.approval is not None:
                check_eligible(
                    part.waiting.approval, principal.subject, principal.role, principal.groups
                )

    async def resolution(
        self,
        principal: Principal,
        thread_id: str,
        action_id: str,
        payload: Mapping[str, Any],
        kind: WaitKind | None,
        origin: Origin | None,
    ) -> Resolution:
        """The resolution the store compare-and-sets. An approval's is also a decision (the
        tool's denial rule says approve or deny), recorded and audited with `origin`."""
        at = await self.store.db_time()
        decision = None
        part = await self._pending_part(principal, thread_id, action_id)
        if part is not None and kind in (None, WaitKind.APPROVAL):
            decision = ApprovalDecision(
                subject=principal.subject,
                display_name=principal.name,
                approved=self._approves(part.name, payload),
                payload=dict(payload),
                at=at,
            )
        return Resolution(
            subject=principal.subject,
            role=principal.role,
            payload=dict(payload),
            at=at,
            display_name=principal.display_name,
            decision=decision,
            origin=origin,
        )

    def _approves(self, tool_name: str, payload: Mapping[str, Any]) -> bool:
        tool_ = self.agent.tool(tool_name)
        if tool_ is None or tool_.suspend is None or tool_.suspend.denial is None:
            return True
        try:
            return tool_.suspend.denial(tool_.suspend.payload.model_validate(dict(payload))) is None
        except ValidationError:
            return True  # check_payload refused it already; the store never sees it

    async def _pending_part(
        self, principal: Principal, thread_id: str, action_id: str
    ) -> ToolCallPart | None:
        messages = await self._messages(principal, thread_id)
        if not messages:
            return None
        for part in messages[-1].parts:
            if (
                isinstance(part, ToolCallPart)
                and part.waiting is not None
                and part.waiting.action_id == action_id
                and part.is_pending
            ):
                return part
        return None

    async def _messages(self, principal: Principal, thread_id: str) -> list[Any]:
        await self.store.get_thread(thread_id, principal.scopes)
        return await self.store.list_messages(thread_id)

    # --- stop ----------------------------------------------------------------------------

    async def stop_run(self, principal: Principal, thread_id: str, run_id: str) -> StopResult:
        await self.access.require_stop(principal, thread_id, run_id)
        result = await self.store.request_stop(thread_id, principal.scopes, run_id)
        if result.status.is_terminal:
            await self.publisher.invalidate(thread_id, result.version)
        else:
            # The worker owning the run (or the next one to lease it) finalises it.
            await self.publisher.stop(run_id)
            await self.publisher.wakeup(run_id, thread_id)
        return result


def _check_client_tool_names(agent: Agent, names: Sequence[str]) -> None:
    """Tool assembly needs one tool per name: a client tool may not shadow a server tool (the
    model would see both and the server one would run) nor another client tool."""
    seen: set[str] = set()
    errors = []
    for index, name in enumerate(names):
        if agent.tool(name) is not None:
            errors.append(((index, "name"), f"{name!r} is the name of a server tool"))
        elif name in seen:
            errors.append(((index, "name"), f"{name!r} is defined twice"))
        seen.add(name)
    if errors:
        raise InvalidInput(
            "client tool names must differ from server tools and each other",
            errors=field_errors((("client_tools", *loc), msg) for loc, msg in errors),
        )


def _default_scope(principal: Principal) -> str:
    if len(principal.scopes) != 1:
        raise InvalidInput("this token has several scopes: say which one with 'scope'")
    return next(iter(principal.scopes))


__all__ = [
    "TRUSTED_ROLES",
    "ThreadService",
    "field_errors",
    "require_trusted",
    "validation_field_errors",
]
