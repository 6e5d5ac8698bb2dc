"""The command table: each command declared once; HTTP routes, frames and docs derive from it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from runtime.authorization import ThreadMatch
from runtime.domain import Principal, Snapshot, WaitKind
from runtime.errors import InvalidInput
from runtime.service.acts import ActPart, InputPart, ResolvePart, StopPart
from runtime.service.client_threads import open_client_thread
from runtime.service.thread_service import require_trusted
from runtime.storage.thread_query import ThreadQuery
from server.live.snapshot_cache import snapshot_etag
from server.protocol.answers import (
    admission_answer,
    metadata_answer,
    principal_answer,
    regenerate_answer,
    stop_answer,
    thread_version_answer,
    threads_answer,
    version_answer,
)
from server.protocol.approval_commands import APPROVAL_COMMANDS
from server.protocol.audit_commands import AUDIT_COMMANDS
from server.protocol.command_model import (
    READ,
    WS_ONLY,
    Caller,
    Command,
    Http,
    query_limit,
    require_admin,
)
from server.protocol.hooks_commands import HOOKS_COMMANDS
from server.protocol.inbox_commands import INBOX_COMMANDS, PRESENCE_COMMANDS
from server.protocol.inputs import (
    CancelQueued,
    CreateThread,
    GetQueued,
    GetSnapshot,
    Input,
    ListThreads,
    NoInput,
    OpenThread,
    Regenerate,
    RenameThread,
    ResumeAction,
    RetryRun,
    RevokeToken,
    SendMessage,
    SetVisibility,
    StopRun,
    SubscribeThread,
    ThreadRef,
    ToolResult,
    UpdateMetadata,
)
from server.protocol.snapshot_reads import read_snapshot, snapshot_query
from server.protocol.token_commands import AUTH_COMMANDS, TOKEN_COMMANDS
from threadline_wire import AdmissionAnswer, fields_doc
from threadline_wire.frames import (
    Pong,
    Subscribed,
    Unsubscribed,
)

T = "/v1/threads/{thread_id}"


def _narrowed(query: ThreadQuery, narrow: tuple[ThreadMatch, ...] | None) -> ThreadQuery:
    return query if narrow is None else replace(query, allowed=narrow)


# Query parameters of `GET /v1/threads` besides `metadata.<key>`; others are refused, so a
# misspelt filter is an error rather than a silently unfiltered list.
_THREAD_FILTERS = ("limit", "status", "updated_after", "updated_before", "cursor")


def _threads_query(query: Mapping[str, str]) -> dict[str, Any]:
    fields: dict[str, Any] = query_limit(query)
    metadata: dict[str, str] = {}
    for name, value in query.items():
        if name.startswith("metadata."):
            metadata[name.removeprefix("metadata.")] = value
        elif name not in _THREAD_FILTERS:
            raise InvalidInput(f"unknown query parameter {name!r}")
        elif name != "limit" and value:
            fields[name] = value
    if metadata:
        fields["metadata"] = metadata
    return fields


def _queued_answer(item: Any) -> dict[str, Any]:
    return {
        "id": item.id,
        "text": item.text,
        "submitted_by": item.submitted_by,
        "interrupt": item.interrupt,
    }


async def _nothing(caller: Caller, data: Input) -> None:
    return None


async def _principal(caller: Caller, data: Input) -> Principal:
    return caller.principal


def _check_result(kind: WaitKind) -> Callable[[Caller, ToolResult], Awaitable[None]]:
    def check(c: Caller, i: ToolResult) -> Awaitable[None]:
        return c.service.check_resume(c.principal, i.thread_id, i.action_id, i.payload(), kind=kind)

    return check


def _tool_result(kind: WaitKind) -> Callable[[Caller, ToolResult], Awaitable[Any]]:
    def call(c: Caller, i: ToolResult) -> Awaitable[Any]:
        return c.service.resume_action(
            c.principal,
            i.thread_id,
            i.action_id,
            i.payload(),
            expected_version=i.expected_version,
            kind=kind,
            origin=c.origin,
        )

    return call


def _result_part(kind: WaitKind) -> Callable[[ToolResult], ActPart]:
    def part(i: ToolResult) -> ActPart:
        return ResolvePart(i.action_id, i.payload(), kind=kind, expected_version=i.expected_version)

    return part


async def _create_thread(c: Caller, i: CreateThread) -> Snapshot:
    snapshot = await c.service.create_thread(
        c.principal, title=i.title, metadata=i.metadata, scope=i.scope
    )
    if c.deltas is not None:  # the creator's delta subscription starts from this answer
        c.deltas.seed(c.principal, snapshot)
    return snapshot


SNAPSHOT = "snapshot"
THREAD_VERSION = '`{"thread_id", "version"}`'

COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="thread.create",
        input=CreateThread,
        call=_create_thread,
        answer=lambda i, snapshot: snapshot.to_wire(),
        answer_doc=SNAPSHOT,
        reply=None,
        http=Http("POST", "/v1/threads", "create_thread", status=201),
        note="answers a snapshot, which only HTTP serves; a websocket watches existing threads",
    ),
    Command(
        name="thread.list",
        input=ListThreads,
        call=lambda c, i: c.service.list_threads(
            c.principal, i.limit, _narrowed(i.query(), c.narrow)
        ),
        answer=lambda i, threads: threads_answer(threads, i.limit),
        answer_doc='`{"threads": [{"id", "scope", "title", "version", "metadata", "owner", '
        '"created_at", "updated_at"}], "next_cursor"}`: newest update first; '
        "`?metadata.<key>=<value>`, `status` (idle, running, waiting), `updated_after`, "
        "`updated_before`, `cursor`, `limit`",
        reply=None,
        http=Http("GET", "/v1/threads", "list_threads", body=False, query=_threads_query),
        note=READ,
        limited=False,
    ),
    Command(
        name="thread.snapshot",
        input=GetSnapshot,
        call=read_snapshot,
        answer=lambda i, snapshot: snapshot.to_wire(),
        answer_doc=f"{SNAPSHOT}: the last messages; `?before=<page.before>` pages older ones;"
        " an `ETag` header, and `304` (no body) to an `If-None-Match` naming the current one",
        reply=None,
        http=Http("GET", T, "snapshot", body=False, query=snapshot_query, etag=snapshot_etag),
        note=READ,
        limited=False,
    ),
    Command(
        name="thread.rename",
        input=RenameThread,
        call=lambda c, i: c.service.rename_thread(c.principal, i.thread_id, i.title),
        answer=lambda i, thread: thread_version_answer(thread),
        answer_doc=THREAD_VERSION,
        http=Http("PATCH", T, "rename_thread"),
    ),
    Command(
        name="thread.update_metadata",
        input=UpdateMetadata,
        call=lambda c, i: c.service.update_metadata(c.principal, i.thread_id, i.metadata),
        answer=lambda i, thread: metadata_answer(thread),
        answer_doc='`{"thread_id", "version", "metadata"}`: `metadata` a JSON merge patch '
        "(RFC 7396: `null` removes a key); the answer has the whole result",
        http=Http("PATCH", f"{T}/metadata", "update_thread_metadata"),
    ),
    Command(
        name="subscribe",
        input=SubscribeThread,
        call=lambda c, i: c.session().subscribe(i.thread_id, c.frame_id, i.deltas),
        answer=lambda i, r: None,  # `subscribed` goes out before the replay, from the session
        answer_doc='`{"type": "subscribed", "thread_id", "version"}`, then the replay of the '
        "in-flight step's chunks, then live frames (`deltas`: true: invalidations carry the "
        "snapshot delta, see Snapshot deltas)",
        reply=Subscribed,
        note=WS_ONLY,
        limited=False,
    ),
    Command(
        name="unsubscribe",
        input=ThreadRef,
        call=lambda c, i: c.session().unsubscribe(i.thread_id),
        answer=lambda i, r: {"thread_id": i.thread_id},
        answer_doc='`{"type": "unsubscribed", "thread_id"}`',
        reply=Unsubscribed,
        note=WS_ONLY,
        limited=False,
    ),
    Command(
        name="message.send",
        input=SendMessage,
        call=lambda c, i: c.service.send_message(
            c.principal,
            i.thread_id,
            i.text,
            client_request_id=i.client_request_id,
            policy=i.policy,
            client_tools=[tool.model_dump() for tool in i.client_tools],
        ),
        answer=lambda i, admission: admission_answer(admission),
        answer_doc=fields_doc(AdmissionAnswer),
        http=Http("POST", f"{T}/messages", "send_message", status=202),
        part=lambda i: InputPart(
            text=i.text,
            client_request_id=i.client_request_id,
            policy=i.policy,
            client_tools=[tool.model_dump() for tool in i.client_tools],
        ),
    ),
    Command(
        name="queue.cancel",
        input=CancelQueued,
        call=lambda c, i: c.service.cancel_queued(c.principal, i.thread_id, i.item_id),
        answer=lambda i, version: {"thread_id": i.thread_id, "version": version},
        answer_doc=THREAD_VERSION,
        http=Http("DELETE", f"{T}/queue/{{item_id}}", "cancel_queued", body=False),
    ),
    Command(
        name="queue.item",
        input=GetQueued,
        call=lambda c, i: c.service.queued_item(c.principal, i.thread_id, i.item_id),
        answer=lambda i, item: _queued_answer(item),
        answer_doc='`{"id", "text", "submitted_by", "interrupt"}`: the full text of a queued item',
        reply=None,
        http=Http("GET", f"{T}/queue/{{item_id}}", "queued_item", body=False),
        note=READ,
        limited=False,
    ),
    Command(
        name="action.resume",
        input=ResumeAction,
        call=lambda c, i: c.service.resume_action(
            c.principal,
            i.thread_id,
            i.action_id,
            i.payload,
            expected_version=i.expected_version,
            origin=c.origin,
        ),
        answer=lambda i, result: version_answer(result),
        answer_doc=f"{THREAD_VERSION}; errors `conflict` (409), `invalid_payload` (422)",
        http=Http("POST", f"{T}/actions/{{action_id}}/resume", "resume"),
        precheck=lambda c, i: c.service.check_resume(
            c.principal, i.thread_id, i.action_id, i.payload
        ),
        part=lambda i: ResolvePart(i.action_id, i.payload, expected_version=i.expected_version),
    ),
    Command(
        name="action.client_result",
        input=ToolResult,
        call=_tool_result(WaitKind.CLIENT_TOOL),
        precheck=_check_result(WaitKind.CLIENT_TOOL),
        part=_result_part(WaitKind.CLIENT_TOOL),
        answer=lambda i, result: version_answer(result),
        answer_doc=f"{THREAD_VERSION} (actions of kind `client-tool`)",
        http=Http("POST", f"{T}/actions/{{action_id}}/client-result", "client_result"),
    ),
    Command(
        name="action.manual_result",
        input=ToolResult,
        call=_tool_result(WaitKind.MANUAL_RESULT),
        precheck=_check_result(WaitKind.MANUAL_RESULT),
        part=_result_part(WaitKind.MANUAL_RESULT),
        answer=lambda i, result: version_answer(result),
        answer_doc=f"{THREAD_VERSION} (kind `manual-result`; role `backend` or `admin`)",
        http=Http("POST", f"{T}/actions/{{action_id}}/manual-result", "manual_result"),
        authorize=require_trusted,
    ),
    Command(
        name="run.stop",
        input=StopRun,
        call=lambda c, i: c.service.stop_run(c.principal, i.thread_id, i.run_id),
        answer=lambda i, result: stop_answer(result),
        answer_doc='`{"thread_id", "version", "run_id", "status"}`',
        http=Http("POST", f"{T}/runs/{{run_id}}/stop", "stop_run", status=202),
        precheck=lambda c, i: c.service.access.require_stop(c.principal, i.thread_id, i.run_id),
        part=lambda i: StopPart(i.run_id),
    ),
    Command(
        name="regenerate",
        input=Regenerate,
        call=lambda c, i: c.service.regenerate(
            c.principal, i.thread_id, i.message_id, expected_version=i.expected_version
        ),
        answer=lambda i, result: regenerate_answer(result),
        answer_doc='`{"thread_id", "version", "run_id"}`; error `conflict` (409) when '
        "`expected_version` is stale, or when the thread changed after the server read it to "
        "choose what to delete (nothing is deleted)",
        http=Http("POST", f"{T}/regenerate", "regenerate", status=202),
    ),
    Command(
        name="run.retry",
        input=RetryRun,
        call=lambda c, i: c.service.retry(
            c.principal, i.thread_id, i.run_id, expected_version=i.expected_version
        ),
        answer=lambda i, result: regenerate_answer(result),
        answer_doc='`{"thread_id", "version", "run_id"}` (the new run); error `conflict` (409) '
        "unless the run is the thread's latest and failed or cancelled",
        http=Http("POST", f"{T}/runs/{{run_id}}/retry", "retry_run", status=202),
    ),
    Command(
        name="message.visibility",
        input=SetVisibility,
        call=lambda c, i: c.service.set_visibility(
            c.principal,
            i.thread_id,
            i.message_id,
            i.visibility,
            expected_version=i.expected_version,
        ),
        answer=lambda i, result: version_answer(result),
        answer_doc=THREAD_VERSION,
        http=Http("POST", f"{T}/messages/{{message_id}}/visibility", "set_visibility"),
    ),
    Command(
        name="token.revoke",
        input=RevokeToken,
        call=lambda c, i: c.tokens().revoke(c.principal, i.token),
        answer=lambda i, result: result,
        answer_doc='`{"revoked": true, "subject", "published"}`; its websockets close with 4403',
        reply=None,
        http=Http("POST", "/v1/tokens/revoke", "revoke_token"),
        authorize=require_admin,
        note="administration over HTTP only (also `threadline token revoke`)",
    ),
    Command(
        name="ping",
        input=NoInput,
        call=_nothing,
        answer=lambda i, r: {},
        answer_doc='`{"type": "pong"}`',
        reply=Pong,
        note="keepalive for clients that cannot see protocol pings; HTTP needs none",
        limited=False,
    ),
    Command(
        name="me",
        input=NoInput,
        call=_principal,
        answer=lambda i, principal: principal_answer(principal),
        answer_doc='`{"subject", "role", "scopes", "name"}` (name: display name or subject)',
        reply=None,
        http=Http("GET", "/v1/me", "me", body=False),
        note="a read of the token itself, which the websocket checked when it opened",
        limited=False,
    ),
)
# Threads named by the client, as the event-stream protocols do (docs/protocol.md, "Thread ids").
SSE_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="thread.open",
        input=OpenThread,
        call=lambda c, i: open_client_thread(c.service, c.principal, i.thread_id, create=i.create),
        answer=lambda i, opened: {"thread_id": opened.thread_id},
        answer_doc='`{"thread_id"}`: the Threadline id of the client\'s thread',
        reply=None,
        sse="`POST /v1/ag-ui`, `POST /v1/ai-sdk/chat`, `GET /v1/ai-sdk/chat/{thread_id}/stream`",
        note="a thread by the id an AG-UI or AI SDK client chose; every request of those routes "
        "opens one (and is charged for it)",
    ),
)
# The inbox and presence, tokens, schedules and webhooks (docs/protocol.md, "Schedules",
# "Webhooks"), the audit log ("Audit log") and approvals are rows of their own modules.
COMMANDS = (
    COMMANDS
    + INBOX_COMMANDS
    + PRESENCE_COMMANDS
    + SSE_COMMANDS
    + TOKEN_COMMANDS
    + AUTH_COMMANDS
    + HOOKS_COMMANDS
    + AUDIT_COMMANDS
    + APPROVAL_COMMANDS
)
BY_NAME: dict[str, Command[Any, Any]] = {command.name: command for command in COMMANDS}
