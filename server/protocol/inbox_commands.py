"""The command-table rows of the scope-wide action inbox and of presence (docs/protocol.md,
"Action inbox", "Presence"); `commands` appends them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.errors import InvalidInput
from server.protocol.answers import actions_answer
from server.protocol.command_model import READ, WS_ONLY, Command, Http, query_limit
from server.protocol.inputs import InboxSubscribe, ListActions, PresenceUpdate, ScopeRef
from threadline_wire.frames import ActionsSubscribed, ActionsUnsubscribed


def actions_query(query: Mapping[str, str]) -> dict[str, Any]:
    status = query.get("status", "pending")
    if status != "pending":
        raise InvalidInput("query parameter 'status' must be 'pending'")
    fields: dict[str, Any] = {"status": status, **query_limit(query)}
    if query.get("cursor"):
        fields["cursor"] = query["cursor"]
    if "assigned" in query:
        fields["assigned"] = query["assigned"]  # the input refuses anything but "me"
    return fields


# The scope-wide action inbox (docs/protocol.md, "Action inbox"): a read over HTTP, live
# announcements over the websocket.
INBOX_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="actions.list",
        input=ListActions,
        call=lambda c, i: c.service.pending_actions(
            c.principal, i.limit, i.cursor, assigned=i.assigned == "me", allowed=c.narrow
        ),
        answer=lambda i, page: actions_answer(page),
        answer_doc='`{"actions": [{"id", "kind", "thread_id", "scope", "thread_version", '
        '"tool_name", "input", "schema", "allowed_roles", "created_at", ...}], "next_cursor"}`; '
        "`?assigned=me`: only what the caller may decide now",
        reply=None,
        http=Http("GET", "/v1/actions", "list_actions", body=False, query=actions_query),
        note=READ,
    ),
    Command(
        name="actions.subscribe",
        input=InboxSubscribe,
        call=lambda c, i: c.session().subscribe_actions(
            i.scope, assigned=i.assigned == "me", allowed=c.narrow
        ),
        answer=lambda i, scopes: {"scopes": scopes},
        answer_doc='`{"type": "actions.subscribed", "scopes"}`, then `action.pending`, '
        "`action.resolved` and `actions.resync` frames (`assigned`: `me`, only what the caller "
        "may decide)",
        reply=ActionsSubscribed,
        note=WS_ONLY,
    ),
    Command(
        name="actions.unsubscribe",
        input=ScopeRef,
        call=lambda c, i: c.session().unsubscribe_actions(i.scope),
        answer=lambda i, scopes: {"scopes": scopes},
        answer_doc='`{"type": "actions.unsubscribed", "scopes"}`',
        reply=ActionsUnsubscribed,
        note=WS_ONLY,
    ),
)
# Presence (docs/protocol.md, "Presence"): live state of a connection, never stored.
PRESENCE_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="presence.update",
        input=PresenceUpdate,
        call=lambda c, i: c.session().update_presence(i.thread_id, i.changes()),
        answer=lambda i, r: {"thread_id": i.thread_id},
        answer_doc='`ack` `{"thread_id"}`; the thread\'s subscribers then get `presence.update`',
        note="presence belongs to a websocket connection subscribed to the thread",
    ),
)
