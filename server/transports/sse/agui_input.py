"""AG-UI's `RunAgentInput` as the table's commands: planned and checked whole, then one act."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from ag_ui.core import RunAgentInput
from pydantic import ValidationError

from runtime.domain import InputPolicy, Snapshot, WaitKind
from runtime.errors import InvalidInput, NotFound
from runtime.service.thread_service import field_errors, validation_field_errors
from server.protocol.command_model import Caller, Step, run_together
from server.protocol.commands import BY_NAME

# The keys of the shared state the server derives (agui.shared_state): a client echoes them back.
SERVER_STATE_KEYS = frozenset({"run", "pendingActions"})


def parse_input(raw: bytes) -> RunAgentInput:
    try:
        data = RunAgentInput.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise InvalidInput(
            "the body is not an AG-UI RunAgentInput", errors=validation_field_errors(exc)
        ) from exc
    except RecursionError as exc:
        raise InvalidInput("the body is nested too deeply") from exc
    check_state(data.state)
    return data


def check_state(state: Any) -> None:
    """The shared state is the server's, derived from committed state: a client may send it
    back (its keys are re-derived on every run, whatever they hold) but not add to it, since
    nothing would apply what it adds. Refused, not ignored, so no write is lost unseen."""
    if state is None:
        return
    if not isinstance(state, dict):
        raise InvalidInput("state must be an object: the shared state is read-only here")
    foreign = sorted(key for key in state if key not in SERVER_STATE_KEYS)
    if foreign:
        raise InvalidInput(
            f"state key(s) {', '.join(map(repr, foreign[:5]))} cannot be set: the shared state "
            "is derived from the thread and read-only (see GET /v1/ag-ui/info)",
            errors=field_errors((("state", key), "read-only") for key in foreign[:20]),
        )


@dataclass
class Plan:
    """What one request does: the commands in the order they run, as one act on `thread_id`
    (`run_together`: all of them commit, or none), and the run they lead to.

    `follow` is the run a resume, client result or cancel continues (None: a new message's run,
    known once it is admitted, or a join). `ending`: an interrupt was cancelled, so the run
    followed is over only once it ended (a stop of a waiting run is finalised by a worker: until
    then the run still reads `waiting`, and finishing on that would hand the client the
    interrupt it just cancelled). Steps that resolve actions which are not pending go first: the
    store refuses them (conflict naming the winner, or not_found), and the act with them.
    """

    thread_id: str
    steps: list[Step] = field(default_factory=list)
    follow: str | None = None
    sends: bool = False
    ending: bool = False


def _step(caller: Caller, name: str, **fields: Any) -> Step:
    command = BY_NAME[name]
    return command, command.parse(caller, fields)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content or ())


def sent_text(content: Any) -> str:
    """The text of a user message the request sends; refuses content parts other than text
    (images, audio, documents): a Threadline message holds text, and dropping a part would
    answer a question the user did not ask."""
    if not isinstance(content, str):
        other = sorted({str(getattr(part, "type", "?")) for part in content or ()} - {"text"})
        if other:
            raise InvalidInput(
                f"content parts of type {', '.join(map(repr, other))} are not supported: "
                "Threadline messages hold text only (see GET /v1/ag-ui/info)",
                errors=field_errors((("messages", "content"), f"unsupported: {t}") for t in other),
            )
    return _text(content)


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
    result = Plan(thread_id)
    doomed: list[Step] = []
    for entry in data.resume or ():
        action = pending.get(entry.interrupt_id)
        if snapshot is None:
            raise NotFound(f"action {entry.interrupt_id} not found")
        if entry.status == "cancelled" and action is not None and action.run_id:
            result.steps.append(
                _step(caller, "run.stop", thread_id=thread_id, run_id=action.run_id)
            )
            result.follow, result.ending = action.run_id, True
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
    # A new message with resumes goes with them: queued behind the run they continue (or
    # refused with them: a full queue leaves the actions pending).
    if last is not None and last.role == "user" and last.id not in known:
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
                text=sent_text(last.content),
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
    returned), as one act. Returns the run to follow ("queued": the new message waits in the
    queue and no resumed run goes first; None: nothing new to follow)."""
    if not request.steps:
        return request.follow
    outcome = await run_together(charged, request.thread_id, request.steps)
    resumed = [r.run_id for r in outcome.resolved if r.run_id]
    run_id = resumed[-1] if resumed else request.follow
    admission = outcome.admission
    if admission is not None and admission.run_id is None and admission.queued_item_id:
        return run_id or "queued"
    if admission is not None:
        run_id = admission.run_id or run_id
    return run_id
