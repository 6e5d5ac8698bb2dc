"""AG-UI over SSE: `RunAgentInput` in, AG-UI events (ag-ui-protocol's models) out, per thread."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from ag_ui.core import (
    AssistantMessage,
    EventType,
    FunctionCall,
    Interrupt,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.core.events import BaseEvent
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.domain import (
    InputPolicy,
    MessageView,
    PendingAction,
    Principal,
    RunStatus,
    Snapshot,
    TextPart,
    ToolCallPart,
    ToolState,
    WaitKind,
)
from runtime.errors import InvalidInput
from runtime.service.thread_service import ThreadService, validation_field_errors
from server.protocol.wire_errors import wire_error
from server.transports.http_routes import read_body
from server.transports.sse.thread_stream import (
    Chunk,
    Committed,
    ThreadFeed,
    caller_of,
    is_settled,
    open_feed,
    sse_response,
)

# Tool states that close a tool call with a result message.
FINAL_STATES = frozenset(
    {
        ToolState.OUTPUT_AVAILABLE,
        ToolState.OUTPUT_ERROR,
        ToolState.REJECTED,
        ToolState.CANCELLED,
        ToolState.SKIPPED,
    }
)


def result_id(tool_call_id: str) -> str:
    """The id of the tool message answering a call: derived, so every stream names it alike."""
    return f"result-{tool_call_id}"


def tool_content(part: ToolCallPart) -> str:
    if part.state is ToolState.OUTPUT_AVAILABLE:
        return orjson.dumps(part.output).decode()
    return orjson.dumps({"state": part.state.value, "error": part.error}).decode()


def agui_messages(snapshot: Snapshot) -> list[Any]:
    """Committed messages as AG-UI messages: text, tool calls, and a tool message per result."""
    out: list[Any] = []
    for message in snapshot.messages:
        out.extend(_agui_message(message))
    return out


def _agui_message(message: MessageView) -> list[Any]:
    text = "".join(p.text for p in message.parts if isinstance(p, TextPart))
    calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
    if message.role == "user":
        return [UserMessage(id=message.id, content=text)]
    if message.role != "assistant":
        return []
    tool_calls = [
        ToolCall(
            id=p.tool_call_id,
            function=FunctionCall(name=p.name, arguments=orjson.dumps(p.input).decode()),
        )
        for p in calls
    ]
    out: list[Any] = [
        AssistantMessage(id=message.id, content=text or None, tool_calls=tool_calls or None)
    ]
    out += [
        ToolMessage(
            id=result_id(p.tool_call_id), content=tool_content(p), tool_call_id=p.tool_call_id
        )
        for p in calls
        if p.state in FINAL_STATES
    ]
    return out


def interrupt_of(action: PendingAction) -> Interrupt:
    return Interrupt(
        id=action.id,
        reason="tool_approval" if action.kind is WaitKind.APPROVAL else str(action.kind),
        message=f"{action.tool_name} waits for {action.kind}",
        tool_call_id=action.tool_call_id,
        response_schema=action.payload_schema,
        metadata={"tool_name": action.tool_name, "input": action.input},
    )


def shared_state(snapshot: Snapshot) -> dict[str, Any]:
    """What AG-UI's shared state reports of a thread: its last run and its pending actions.

    Read-only: the server derives it from committed state (a client's `state` input is ignored).
    Tool inputs are left out (they are the tool call's, in the messages).
    """
    run = snapshot.run
    return {
        "run": None if run is None else {"id": run.id, "status": run.status.value},
        "pendingActions": [
            {
                "id": action.id,
                "kind": action.kind.value,
                "toolName": action.tool_name,
                "toolCallId": action.tool_call_id,
                "runId": action.run_id,
                "allowedRoles": [role.value for role in action.allowed_roles],
            }
            for action in snapshot.pending_actions
        ],
    }


def state_delta(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON Patch (RFC 6902) from `before` to `after`: one `replace` per changed key (both
    have the same keys, so a replace always applies)."""
    return [
        {"op": "replace", "path": f"/{key}", "value": value}
        for key, value in after.items()
        if before.get(key) != value
    ]


@dataclass
class RunStream:
    """Turns one run's canonical chunks into AG-UI events (the state of the open message)."""

    thread_id: str
    run_id: str
    text_id: str | None = None
    step: str | None = None  # the open step: AG-UI requires it finished before the run
    messages: int = 0
    tool_names: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] | None = None  # the shared state last sent

    def state_events(self, snapshot: Snapshot) -> list[BaseEvent]:
        """STATE_SNAPSHOT the first time, then STATE_DELTA when committed state changed it."""
        state = shared_state(snapshot)
        before, self.state = self.state, state
        if before is None:
            return [StateSnapshotEvent(snapshot=state)]
        delta = state_delta(before, state)
        return [StateDeltaEvent(delta=delta)] if delta else []

    def chunk(self, chunk: Chunk) -> list[BaseEvent]:
        data = chunk.chunk
        kind = data.get("type")
        if kind == "step-start":
            events = self.close_step()
            self.step = f"step-{data['step']}"
            return [*events, StepStartedEvent(step_name=self.step)]
        if kind == "step-finish":
            return self.close_step()
        if kind == "text-delta":
            delta = str(data.get("delta", ""))
            if not delta:
                return []
            out: list[BaseEvent] = []
            if self.text_id is None:
                self.messages += 1
                self.text_id = f"{chunk.run_id}-{self.messages}"
                out.append(TextMessageStartEvent(message_id=self.text_id, role="assistant"))
            out.append(TextMessageContentEvent(message_id=self.text_id, delta=delta))
            return out
        if kind == "tool-call":
            call_id = str(data["tool_call_id"])
            self.tool_names[call_id] = str(data["name"])
            parent = self.text_id
            return [
                *self.close_text(),
                ToolCallStartEvent(
                    tool_call_id=call_id, tool_call_name=str(data["name"]), parent_message_id=parent
                ),
                ToolCallArgsEvent(tool_call_id=call_id, delta=orjson.dumps(data["input"]).decode()),
                ToolCallEndEvent(tool_call_id=call_id),
            ]
        if kind == "tool-state" and ToolState(data["state"]) in FINAL_STATES:
            part = ToolCallPart(
                tool_call_id=data["tool_call_id"],
                name=self.tool_names.get(data["tool_call_id"], "tool"),
                state=ToolState(data["state"]),
                output=data.get("output"),
                error=data.get("error"),
            )
            return [
                *self.close_text(),
                ToolCallResultEvent(
                    # A streaming id, like the text's: the closing snapshot replaces both with
                    # committed messages, which a client then holds in committed order.
                    message_id=f"{chunk.run_id}-{part.tool_call_id}",
                    tool_call_id=part.tool_call_id,
                    content=tool_content(part),
                    role="tool",
                ),
            ]
        return []  # run-takeover and intermediate tool states: the snapshot settles them

    def close_text(self) -> list[BaseEvent]:
        if self.text_id is None:
            return []
        text_id, self.text_id = self.text_id, None
        return [TextMessageEndEvent(message_id=text_id)]

    def close_step(self) -> list[BaseEvent]:
        if self.step is None:
            return self.close_text()
        step, self.step = self.step, None
        return [*self.close_text(), StepFinishedEvent(step_name=step)]

    def finish(self, snapshot: Snapshot) -> list[BaseEvent]:
        """The run settled: converge on committed state, then say how it ended."""
        events: list[BaseEvent] = [
            *self.close_step(),
            MessagesSnapshotEvent(messages=agui_messages(snapshot)),
            *self.state_events(snapshot),
        ]
        run = snapshot.run
        status = run.status if run is not None and run.id == self.run_id else RunStatus.COMPLETED
        if status is RunStatus.FAILED:
            message = (run.error if run is not None else None) or "the run failed"
            return [*events, RunErrorEvent(message=message, code="run_failed")]
        if status is RunStatus.CANCELLED:
            return [*events, self.finished(RunFinishedCancelledOutcome())]
        actions = [a for a in snapshot.pending_actions if a.run_id == self.run_id]
        asks = [a for a in actions if a.kind is not WaitKind.CLIENT_TOOL]
        if asks:
            outcome: Any = RunFinishedInterruptOutcome(interrupts=[interrupt_of(a) for a in asks])
            return [*events, self.finished(outcome)]
        pending = [a.tool_call_id for a in actions] or None
        return [*events, self.finished(RunFinishedSuccessOutcome(pending_tool_call_ids=pending))]

    def finished(self, outcome: Any) -> RunFinishedEvent:
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome)


def error_event(exc: BaseException) -> RunErrorEvent:
    """A failure as RUN_ERROR: its wire code, and its details (a conflict's winner) as metadata."""
    error = wire_error(exc)
    return RunErrorEvent(message=error.message, code=error.code, metadata=error.details or None)


# --- the request ------------------------------------------------------------------------


def parse_input(raw: bytes) -> RunAgentInput:
    try:
        return RunAgentInput.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise InvalidInput(
            "the body is not an AG-UI RunAgentInput", errors=validation_field_errors(exc)
        ) from exc


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content or ())


async def act(
    service: ThreadService, principal: Principal, data: RunAgentInput, snapshot: Snapshot
) -> str | None:
    """Apply what the input asks (resumes, client results, a new user message).

    Returns the run to follow (None: only join the thread). Raises on a refusal, which the
    stream reports as RUN_ERROR.
    """
    thread_id = data.thread_id
    run_id: str | None = None
    pending = {a.id: a for a in snapshot.pending_actions}
    for entry in data.resume or ():
        action = pending.get(entry.interrupt_id)
        if entry.status == "cancelled" and action is not None and action.run_id:
            await service.stop_run(principal, thread_id, action.run_id)
            continue
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        # An interrupt is an approval or a manual result: each resolved under its kind's rule.
        kind = action.kind if action is not None else None
        result = await service.resume_action(
            principal, thread_id, entry.interrupt_id, payload, kind=kind
        )
        run_id = result.run_id or (action.run_id if action else None) or run_id
    by_call = {a.tool_call_id: a for a in pending.values() if a.kind is WaitKind.CLIENT_TOOL}
    for message in data.messages:
        action = by_call.get(getattr(message, "tool_call_id", None) or "")
        if message.role == "tool" and action is not None:
            output = _tool_output(_text(message.content))
            payload = {"output": output, "error": None}
            result = await service.resume_action(
                principal, thread_id, action.id, payload, kind=WaitKind.CLIENT_TOOL
            )
            run_id = result.run_id or action.run_id or run_id
    last = data.messages[-1] if data.messages else None
    known = {m.id for m in snapshot.messages}
    if last is not None and last.role == "user" and last.id not in known and run_id is None:
        tools = [
            {"name": t.name, "description": t.description, **_parameters(t.parameters)}
            for t in data.tools or ()
        ]
        admission = await service.send_message(
            principal,
            thread_id,
            _text(last.content),
            client_request_id=last.id[:200],
            policy=_policy(data, snapshot),
            client_tools=tools,
        )
        run_id = admission.run_id
        if run_id is None and admission.queued_item_id is not None:
            return "queued"
    if run_id is None and snapshot.run is not None and not is_settled(snapshot, snapshot.run.id):
        run_id = snapshot.run.id
    return run_id


def _parameters(parameters: Any) -> dict[str, Any]:
    return {"parameters": parameters} if isinstance(parameters, dict) else {}


def _tool_output(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _policy(data: RunAgentInput, snapshot: Snapshot) -> InputPolicy:
    """`forwardedProps.policy`, else the thread's `input_policy` metadata, else enqueue."""
    props = data.forwarded_props if isinstance(data.forwarded_props, dict) else {}
    raw = props.get("policy") or snapshot.thread.metadata.get("input_policy") or "enqueue"
    try:
        return InputPolicy(raw)
    except ValueError as exc:
        raise InvalidInput(f"unknown input policy {raw!r}") from exc


async def events(
    service: ThreadService, feed: ThreadFeed, principal: Principal, data: RunAgentInput
) -> AsyncIterator[BaseEvent]:
    """The whole answer: RUN_STARTED, the run's events, and RUN_FINISHED or RUN_ERROR.

    The feed listens before the input is applied, and its first snapshot is read after: so the
    client sees its own message committed, and every chunk of the run exactly once.
    """
    stream = RunStream(data.thread_id, data.run_id)
    before = await feed.snapshot()
    try:
        target = await act(service, principal, data, before)
    except Exception as exc:
        yield RunStartedEvent(thread_id=data.thread_id, run_id=data.run_id)
        yield error_event(exc)
        return
    queued = target == "queued"
    prior = before.run.id if before.run is not None else None
    if target is not None and not queued:
        stream.run_id = target
    elif target is None and before.run is not None:
        stream.run_id = before.run.id  # a join ends as the thread's last run ended (or waits)
    source = feed.events()
    first = await anext(source)
    assert isinstance(first, Committed)
    yield RunStartedEvent(thread_id=data.thread_id, run_id=stream.run_id)
    # Join: committed state first; the in-flight step's replay and live chunks follow.
    yield MessagesSnapshotEvent(messages=agui_messages(first.snapshot))
    for event in stream.state_events(first.snapshot):
        yield event
    item: Chunk | Committed = first
    if target is None:
        for event in stream.finish(first.snapshot):
            yield event
        return
    while True:
        if isinstance(item, Committed):
            run = item.snapshot.run
            if queued and run is not None and run.id != prior:
                stream.run_id, queued = run.id, False
            if not queued and is_settled(item.snapshot, stream.run_id):
                for event in stream.finish(item.snapshot):
                    yield event
                return
            if item.reset and item is not first:
                for event in from_reset(stream, item.snapshot):
                    yield event
            if item is not first:
                for event in stream.state_events(item.snapshot):
                    yield event
        elif not queued and item.run_id == stream.run_id:
            for event in stream.chunk(item):
                yield event
        item = await anext(source)


def from_reset(stream: RunStream, snapshot: Snapshot) -> list[BaseEvent]:
    """After a resync the client's partial message is replaced; the replay re-streams it."""
    return [*stream.close_step(), MessagesSnapshotEvent(messages=agui_messages(snapshot))]


async def agui_endpoint(request: Request) -> Response:
    """`POST /v1/ag-ui`: refusals before the stream are JSON errors; after, RUN_ERROR events."""
    try:
        service, principal = await caller_of(request)
        data = parse_input(await read_body(request))
        feed = await open_feed(request, service, principal, data.thread_id, create=True)
    except Exception as exc:
        return wire_error(exc).response()
    encoder = EventEncoder(accept=request.headers.get("accept", ""))
    frames = (encoder.encode(event) async for event in events(service, feed, principal, data))
    return sse_response(
        feed,
        frames,
        on_error=lambda exc: encoder.encode(error_event(exc)),
        media_type=encoder.get_content_type(),
    )


def agui_routes() -> list[BaseRoute]:
    return [Route("/v1/ag-ui", agui_endpoint, methods=["POST"], name="ag_ui")]


__all__ = ["EventType", "agui_routes"]
