"""The command-table rows of approval routing beyond deciding (docs/protocol.md, "Approval
policies"): reassigning an action; `commands` appends them."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from runtime.service.reassign import reassign_action
from server.protocol.answers import version_answer
from server.protocol.command_model import Command, Http
from server.protocol.inputs import ID_MAX, Input, ItemId, ThreadId


class ReassignAction(Input):
    """Hand a pending approval to one subject (`to_subject`) or one group (`to_group`)."""

    thread_id: ThreadId
    action_id: ItemId
    to_subject: str | None = Field(default=None, min_length=1, max_length=ID_MAX)
    to_group: str | None = Field(default=None, min_length=1, max_length=ID_MAX)


APPROVAL_COMMANDS: tuple[Command[Any, Any], ...] = (
    Command(
        name="action.reassign",
        input=ReassignAction,
        call=lambda c, i: reassign_action(
            c.service,
            c.principal,
            i.thread_id,
            i.action_id,
            to_subject=i.to_subject,
            to_group=i.to_group,
            origin=c.origin,
        ),
        answer=lambda i, result: version_answer(result),
        answer_doc='`{"thread_id", "version"}`; exactly one of `to_subject`, `to_group`; errors'
        " `delegation_not_allowed`, `not_a_decider`, `requester_excluded` (403), `conflict`"
        " (409, no longer pending)",
        http=Http("POST", "/v1/threads/{thread_id}/actions/{action_id}/reassign", "reassign"),
    ),
)
