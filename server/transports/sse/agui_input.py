"""AG-UI's `RunAgentInput` as the table's commands: planned and checked whole, then run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from ag_ui.core import RunAgentInput
from pydantic import ValidationError

from runtime.domain import InputPolicy, Snapshot, WaitKind
from runtime.errors import InvalidInput, NotFound
from runtime.service.thread_service import validation_field_errors
from server.protocol.commands import BY_NAME, Caller, Step


def parse_input(raw: bytes) -> RunAgentInput:
    try:
        return RunAgentInput.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise InvalidInput(
            "the body is not an AG-UI RunAgentInput", errors=validation_field_errors(exc)
        ) from exc
    except RecursionError as exc:
        raise InvalidInput("the body is nested too deeply") from exc


@dataclass
class Plan:
    """What one request does: the commands in the order they run, and the run they lead to.

    `follow` is the run a resume or client result continues (None: a new message's run, known
    once it is admitted, or a join). `doomed` steps resolve actions that are not pending: the
    store refuses them (conflict naming the winner, or not_found), so they run first and a
    refusal leaves the rest undone.
    """

    steps: list[Step] = field(default_factory=list)
    follow: str | None = None
    sends: bool = False


def _step(caller: Caller, name: str, **fields: Any) -> Step:
    command = BY_NAME[name]
    return command, command.parse(caller, fields)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content or ())


def _tool_output(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _policy(data: RunAgentInput, snapshot: Snapshot | None) -> InputPolicy:
    """`forwardedProps.policy`, else the thread's `input_policy` metadata, else enqueue."""
    props = data.forwarded_props if isinstance(data.forwarded_props, dict) else {}
    metadata = snapshot.thread.metadata if snapshot is not None else {}
    raw = props.get("policy") or metadata.get("input_policy") or "enqueue"
    try:
        return InputPolicy(raw)
    except ValueError as exc:
        raise InvalidInput(f"unknown input policy {raw!r}") from exc


_RESULT_COMMANDS = {
    WaitKind.CLIENT_TOOL: "action.client_result",
    WaitKind.MANUAL_RESULT: "action.manual_result",
}


def plan(caller: Caller, thread_id: str, data: RunAgentInput, snapshot: Snapshot | None) -> Plan:
    """The commands `data` asks for on the thread `thread_id` (`snapshot`: its committed state,
    None when it does not exist yet), each input validated; raises on the first refusal."""
    pending = {a.id: a for a in snapshot.pending_actions} if snapshot is not None else {}
    result = Plan()
    doomed: list[Step] = []
    for entry in data.resume or ():
        action = pending.get(entry.interrupt_id)
        if snapshot is None:
            raise NotFound(f"action {entry.interrupt_id} not found")
        if entry.status == "cancelled" and action is not None and action.run_id:
            result.steps.append(
                _step(caller, "run.stop", thread_id=thread_id, run_id=action.run_id)
            )
            continue
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        result_command = _RESULT_COMMANDS.get(action.kind) if action is not None else None
        if result_command is not None:
            # An interrupt of a client or manual result: resolved by its own command and rule.
            step = _step(
                caller,
                result_command,
                thread_id=thread_id,
                action_id=entry.interrupt_id,
                output=payload.get("output"),
                error=payload.get("error"),
            )
        else:
            step = _step(
                caller,
                "action.resume",
                thread_id=thread_id,
                action_id=entry.interrupt_id,
                payload=payload,
            )
        if action is None:
            doomed.append(step)
            continue
        result.steps.append(step)
        result.follow = action.run_id or result.follow
    by_call = {a.tool_call_id: a for a in pending.values() if a.kind is WaitKind.CLIENT_TOOL}
    for message in data.messages:
        action = by_call.get(getattr(message, "tool_call_id", None) or "")
        if message.role == "tool" and action is not None:
            result.steps.append(
                _step(
                    caller,
                    "action.client_result",
                    thread_id=thread_id,
                    action_id=action.id,
                    output=_tool_output(_text(message.content)),
                )
            )
            result.follow = action.run_id or result.follow
    last = data.messages[-1] if data.messages else None
    known = {m.id for m in snapshot.messages} if snapshot is not None else set()
    resolving = result.follow is not None or doomed
    if last is not None and last.role == "user" and last.id not in known and not resolving:
        tools = [
            {
                "name": t.name,
                "description": t.description,
                **({"parameters": t.parameters} if isinstance(t.parameters, dict) else {}),
            }
            for t in data.tools or ()
        ]
        result.steps.append(
            _step(
                caller,
                "message.send",
                thread_id=thread_id,
                text=_text(last.content),
                client_request_id=last.id[:200],
                policy=_policy(data, snapshot),
                client_tools=tools,
            )
        )
        result.sends = True
    result.steps = [*doomed, *result.steps]
    return result


async def run_plan(charged: Caller, request: Plan) -> str | None:
    """Run a plan whose steps `charge_together` checked and charged (`charged` is the caller it
    returned). Returns the run to follow ("queued": the new message waits in the queue; None:
    nothing new to follow)."""
    run_id = request.follow
    for command, data in request.steps:
        outcome = await command.result(charged, data)
        if command.name in ("action.resume", "action.client_result"):
            run_id = outcome.run_id or run_id
        elif command.name == "message.send":
            if outcome.run_id is None and outcome.queued_item_id is not None:
                return "queued"
            run_id = outcome.run_id or run_id
    return run_id
