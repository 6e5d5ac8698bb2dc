"""AG-UI over SSE: `RunAgentInput` in, AG-UI events (ag-ui-protocol's models) out, per thread."""

from __future__ import annotations

from collections.abc import AsyncIterator
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
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.domain import (
    MessageView,
    PendingAction,
    RunStatus,
    Snapshot,
    TextPart,
    ToolCallPart,
    ToolState,
    WaitKind,
)
from runtime.errors import NotFound
from server.protocol.command_model import Caller, charge_together
from server.protocol.wire_errors import wire_error
from server.transports.http_routes import read_body, request_caller
from server.transports.sse.agui_info import info_endpoint
from server.transports.sse.agui_input import Plan, parse_input, plan, run_plan
from server.transports.sse.thread_stream import (
    Chunk,
    Committed,
    ThreadFeed,
    create_step,
    is_settled,
    open_feed,
    open_thread,
    sse_response,
)
from server.transports.sse.ui_events import FINAL_STATES, UIEventStream
from threadline_wire.chunks import StepFinishChunk, StepStartChunk, ToolCallChunk


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

    Read-only: the server derives it from committed state (a client may send these keys back,
    re-derived on every run, and no other: agui_input.check_state).
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


class RunStream(UIEventStream[BaseEvent]):
    """One run's typed chunks as AG-UI events, and the shared state last sent."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        super().__init__(run_id)
        self.thread_id = thread_id  # the client's: what AG-UI events name the thread by
        self.step: str | None = None  # the open step: AG-UI requires it finished before the run
        self.state: dict[str, Any] | None = None  # the shared state last sent

    def state_events(self, snapshot: Snapshot) -> list[BaseEvent]:
        """STATE_SNAPSHOT the first time, then STATE_DELTA when committed state changed it."""
        state = shared_state(snapshot)
        before, self.state = self.state, state
        if before is None:
            return [StateSnapshotEvent(snapshot=state)]
        delta = state_delta(before, state)
        return [StateDeltaEvent(delta=delta)] if delta else []

    def handle_step_start(self, chunk: StepStartChunk) -> list[BaseEvent]:
        events = self.close_step()
        self.step = f"step-{chunk.step}"
        return [*events, StepStartedEvent(step_name=self.step)]

    def handle_step_finish(self, chunk: StepFinishChunk) -> list[BaseEvent]:
        return self.close_step()

    def handle_text_start(self, text_id: str) -> list[BaseEvent]:
        return [TextMessageStartEvent(message_id=text_id, role="assistant")]

    def handle_text_delta(self, text_id: str, delta: str) -> list[BaseEvent]:
        return [TextMessageContentEvent(message_id=text_id, delta=delta)]

    def handle_text_end(self, text_id: str) -> list[BaseEvent]:
        return [TextMessageEndEvent(message_id=text_id)]

    def handle_tool_call(self, chunk: ToolCallChunk, *, parent: str | None) -> list[BaseEvent]:
        call_id = chunk.tool_call_id
        return [
            *self.close_text(),
            ToolCallStartEvent(
                tool_call_id=call_id, tool_call_name=chunk.name, parent_message_id=parent
            ),
            ToolCallArgsEvent(tool_call_id=call_id, delta=orjson.dumps(chunk.input).decode()),
            ToolCallEndEvent(tool_call_id=call_id),
        ]

    def handle_tool_result(self, part: ToolCallPart) -> list[BaseEvent]:
        return [
            *self.close_text(),
            ToolCallResultEvent(
                # A streaming id, like the text's: the closing snapshot replaces both with
                # committed messages, which a client then holds in committed order.
                message_id=f"{self.run_id}-{part.tool_call_id}",
                tool_call_id=part.tool_call_id,
                content=tool_content(part),
                role="tool",
            ),
        ]

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


async def events(
    feed: ThreadFeed, charged: Caller, data: RunAgentInput, request: Plan
) -> AsyncIterator[BaseEvent]:
    """The whole answer: RUN_STARTED, the run's events, and RUN_FINISHED or RUN_ERROR.

    The feed listens before the plan runs, and its first snapshot is read after: so the client
    sees its own message committed, and every chunk of the run exactly once. A refusal while
    the plan runs (a resume that lost to another, named in the error) is RUN_ERROR.
    """
    stream = RunStream(data.thread_id, data.run_id)
    before = await feed.snapshot()
    try:
        target = await run_plan(charged, request)
    except Exception as exc:
        yield RunStartedEvent(thread_id=data.thread_id, run_id=data.run_id)
        yield error_event(exc)
        return
    if target is None and before.run is not None and not is_settled(before, before.run.id):
        target = before.run.id  # nothing new: follow the run in flight
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
            if not queued and settled(item.snapshot, stream.run_id, ending=request.ending):
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


def settled(snapshot: Snapshot, run_id: str, *, ending: bool) -> bool:
    """`is_settled`, except that a run being stopped (`ending`) is settled only once it ended."""
    run = snapshot.run
    if ending and run is not None and run.id == run_id:
        return run.status.is_terminal
    return is_settled(snapshot, run_id)


def from_reset(stream: RunStream, snapshot: Snapshot) -> list[BaseEvent]:
    """After a resync the client's partial message is replaced; the replay re-streams it."""
    return [*stream.close_step(), MessagesSnapshotEvent(messages=agui_messages(snapshot))]


async def agui_endpoint(request: Request) -> Response:
    """`POST /v1/ag-ui`: the input as the table's commands, all checked and charged before any
    runs; refusals until then are JSON errors (nothing changed), later ones RUN_ERROR events."""
    try:
        caller = await request_caller(request)
        data = parse_input(await read_body(request))
        thread = await open_thread(caller, data.thread_id, create=False)
        work = plan(caller, thread.thread_id, data, thread.snapshot)
        create = create_step(caller, data.thread_id, thread.snapshot)
        charged = await charge_together(caller, [*create, *work.steps])
        feed = await open_feed(request, caller, thread.thread_id, create, charged)
    except Exception as exc:
        return wire_error(exc).response()
    encoder = EventEncoder(accept=request.headers.get("accept", ""))
    frames = (encoder.encode(event) async for event in events(feed, charged, data, work))
    return sse_response(
        feed,
        frames,
        on_error=lambda exc: encoder.encode(error_event(exc)),
        media_type=encoder.get_content_type(),
    )


async def connect_endpoint(request: Request) -> Response:
    """`POST /v1/ag-ui/connect` (`connectAgent()`): the join of `agui_endpoint` and nothing
    else. It never writes, so the messages and resumes of the input are not acted on: a page
    that reconnects cannot send again what it sent before the connection dropped."""
    try:
        caller = await request_caller(request)
        data = parse_input(await read_body(request))
        thread = await open_thread(caller, data.thread_id, create=False)
        if thread.snapshot is None:
            raise NotFound(f"thread {data.thread_id} not found")
        feed = await open_feed(request, caller, thread.thread_id)
    except Exception as exc:
        return wire_error(exc).response()
    encoder = EventEncoder(accept=request.headers.get("accept", ""))
    frames = (
        encoder.encode(event) async for event in events(feed, caller, data, Plan(thread.thread_id))
    )
    return sse_response(
        feed,
        frames,
        on_error=lambda exc: encoder.encode(error_event(exc)),
        media_type=encoder.get_content_type(),
    )


def agui_routes() -> list[BaseRoute]:
    return [
        Route("/v1/ag-ui", agui_endpoint, methods=["POST"], name="ag_ui"),
        Route("/v1/ag-ui/connect", connect_endpoint, methods=["POST"], name="ag_ui_connect"),
        Route("/v1/ag-ui/info", info_endpoint, methods=["GET"], name="ag_ui_info"),
    ]


__all__ = ["EventType", "agui_routes"]
