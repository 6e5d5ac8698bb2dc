"""The AI SDK's UI message stream (`DefaultChatTransport`): chat POST and the resume GET."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from runtime.domain import (
    InputPolicy,
    MessageView,
    RunStatus,
    Snapshot,
    TextPart,
    ToolCallPart,
    ToolState,
    WaitKind,
)
from runtime.errors import InvalidInput, NotFound, RunActive
from runtime.service.thread_service import validation_field_errors
from server.protocol.command_model import Caller, Step, charge_together, run_together
from server.protocol.commands import BY_NAME
from server.protocol.wire_errors import wire_error
from server.transports.http_routes import read_body, request_caller
from server.transports.sse.thread_stream import (
    Committed,
    ThreadFeed,
    create_step,
    is_settled,
    open_feed,
    open_thread,
    sse_response,
)
from server.transports.sse.ui_events import UIEventStream
from threadline_wire.chunks import StepFinishChunk, StepStartChunk, ToolCallChunk

Part = dict[str, Any]
HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}  # with streams.SSE_HEADERS
THREAD_HEADER = "x-threadline-thread-id"
# How long a stream whose run ended waits for the chunks still queued behind the snapshot that
# said so (they were published before it was read: they come at once, or were lost).
CHUNK_PATIENCE = 1.0
FINISH_REASON = {
    RunStatus.COMPLETED: "stop",
    RunStatus.WAITING: "tool-calls",
    RunStatus.CANCELLED: "other",
    RunStatus.FAILED: "error",
}


class UIMessage(BaseModel):
    """The part of an AI SDK `UIMessage` this endpoint reads; the rest is the client's own."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(max_length=200)
    role: Literal["user", "assistant", "system"]
    parts: list[dict[str, Any]] = Field(default_factory=list)


class ChatRequest(BaseModel):
    """`DefaultChatTransport`'s body; `id` is the chat, which is the Threadline thread."""

    model_config = ConfigDict(extra="allow")
    id: str
    messages: list[UIMessage] = Field(max_length=10_000)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None


def sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _final_chunk(part: ToolCallPart) -> Part | None:
    if part.state is ToolState.OUTPUT_AVAILABLE:
        return {
            "type": "tool-output-available",
            "toolCallId": part.tool_call_id,
            "output": part.output,
        }
    if part.state is ToolState.REJECTED:
        return {"type": "tool-output-denied", "toolCallId": part.tool_call_id}
    if part.state in (ToolState.OUTPUT_ERROR, ToolState.CANCELLED, ToolState.SKIPPED):
        error = part.error or part.state.value
        return {"type": "tool-output-error", "toolCallId": part.tool_call_id, "errorText": error}
    return None


def committed_chunks(message: MessageView) -> list[Part]:
    """A committed step message as the chunks that would have streamed it."""
    out: list[Part] = [{"type": "start-step"}]
    for index, part in enumerate(message.parts):
        if isinstance(part, TextPart) and part.text:
            text_id = f"{message.id}-{index}"
            out += [
                {"type": "text-start", "id": text_id},
                {"type": "text-delta", "id": text_id, "delta": part.text},
                {"type": "text-end", "id": text_id},
            ]
        elif isinstance(part, ToolCallPart):
            out += _tool_call(part.tool_call_id, part.name, part.input)
            final = _final_chunk(part)
            if final is not None:
                out.append(final)
    return [*out, {"type": "finish-step"}]


def _tool_call(call_id: str, name: str, tool_input: Any) -> list[Part]:
    return [
        {"type": "tool-input-start", "toolCallId": call_id, "toolName": name},
        {
            "type": "tool-input-delta",
            "toolCallId": call_id,
            "inputTextDelta": orjson.dumps(tool_input).decode(),
        },
        {
            "type": "tool-input-available",
            "toolCallId": call_id,
            "toolName": name,
            "input": tool_input,
        },
    ]


class UIStream(UIEventStream[Part]):
    """One run's typed chunks as UI message chunks."""

    def handle_step_start(self, chunk: StepStartChunk) -> list[Part]:
        return [{"type": "start-step"}]

    def handle_step_finish(self, chunk: StepFinishChunk) -> list[Part]:
        return [*self.close_text(), {"type": "finish-step"}]

    def handle_text_start(self, text_id: str) -> list[Part]:
        return [{"type": "text-start", "id": text_id}]

    def handle_text_delta(self, text_id: str, delta: str) -> list[Part]:
        return [{"type": "text-delta", "id": text_id, "delta": delta}]

    def handle_text_end(self, text_id: str) -> list[Part]:
        return [{"type": "text-end", "id": text_id}]

    def handle_tool_call(self, chunk: ToolCallChunk, *, parent: str | None) -> list[Part]:
        return [*self.close_text(), *_tool_call(chunk.tool_call_id, chunk.name, chunk.input)]

    def handle_tool_result(self, part: ToolCallPart) -> list[Part]:
        final = _final_chunk(part)
        return [] if final is None else [*self.close_text(), final]

    def finish(self, snapshot: Snapshot) -> list[Part]:
        out = self.close_text()
        run = snapshot.run
        status = run.status if run is not None and run.id == self.run_id else RunStatus.COMPLETED
        for action in snapshot.pending_actions:
            if action.run_id == self.run_id and action.kind is WaitKind.APPROVAL:
                out.append(
                    {
                        "type": "tool-approval-request",
                        "approvalId": action.id,
                        "toolCallId": action.tool_call_id,
                    }
                )
        if status is RunStatus.FAILED:
            error = (run.error if run is not None else None) or "the run failed"
            out.append({"type": "error", "errorText": error})
        if status is RunStatus.CANCELLED:
            out.append({"type": "abort", "reason": "stopped"})
        return [*out, {"type": "finish", "finishReason": FINISH_REASON[status]}]


# --- the requests -----------------------------------------------------------------------


def _text(message: UIMessage) -> str:
    return "".join(str(p.get("text", "")) for p in message.parts if p.get("type") == "text")


def plan(
    caller: Caller, thread_id: str, chat: ChatRequest, snapshot: Snapshot | None
) -> list[Step]:
    """The commands the request asks for, each input validated: approval responses and client
    tool outputs, a regenerate, or a new user message. Raises on the first refusal."""
    if chat.trigger == "regenerate-message":
        return [_step(caller, "regenerate", thread_id=thread_id)]
    last = chat.messages[-1] if chat.messages else None
    if last is None:
        raise InvalidInput("messages must not be empty")
    if last.role == "user":
        # A chat shows one response at a time: a message for a busy thread is refused (by the
        # store, before anything changes), never queued behind a run it could not stream.
        return [
            _step(
                caller,
                "message.send",
                thread_id=thread_id,
                text=_text(last),
                client_request_id=last.id,
                policy=InputPolicy.REJECT,
            )
        ]
    pending = snapshot.pending_actions if snapshot is not None else ()
    by_call = {a.tool_call_id: a for a in pending}
    steps: list[Step] = []
    for part in last.parts:
        approval = part.get("approval")
        call_id = str(part.get("toolCallId", ""))
        if part.get("state") == "approval-responded" and isinstance(approval, dict):
            payload: dict[str, Any] = {"approved": bool(approval.get("approved"))}
            if approval.get("reason"):
                payload["note"] = str(approval["reason"])
            action_id = str(approval.get("id", ""))
            steps.append(
                _step(
                    caller,
                    "action.resume",
                    thread_id=thread_id,
                    action_id=action_id,
                    payload=payload,
                )
            )
        elif (
            part.get("state") in ("output-available", "output-error")
            and call_id in by_call
            and by_call[call_id].kind is WaitKind.CLIENT_TOOL
        ):
            steps.append(
                _step(
                    caller,
                    "action.client_result",
                    thread_id=thread_id,
                    action_id=by_call[call_id].id,
                    output=part.get("output"),
                    error=part.get("errorText"),
                )
            )
    if not steps or snapshot is None:
        raise InvalidInput("the last message answers no pending action of this chat")
    return steps


def _step(caller: Caller, name: str, **fields: Any) -> Step:
    command = BY_NAME[name]
    return command, command.parse(caller, fields)


async def run_steps(charged: Caller, thread_id: str, steps: list[Step]) -> str:
    """Run checked and charged steps; the run they started or resumed. Several (an assistant
    message answering several actions) are one act: all resolved, or none."""
    run_id: str | None = None
    if len(steps) > 1:
        outcome = await run_together(charged, thread_id, steps)
        run_id = next((r.run_id for r in reversed(outcome.resolved) if r.run_id), None)
        steps = []
    for command, data in steps:
        outcome = await command.result(charged, data)
        run_id = outcome.run_id or run_id
        if command.name == "message.send" and outcome.run_id is None:
            # A retried request whose first one was queued.
            raise RunActive("the message waits in the queue: no run to stream yet")
    if run_id is None:
        raise InvalidInput("the last message answers no pending action of this chat")
    return run_id


async def stream_run(feed: ThreadFeed, run_id: str, known: set[str]) -> AsyncIterator[Part]:
    """`start`, then the run's committed steps the client lacks (ids not in `known`), the
    in-flight step's replay, live chunks, and `finish` once the run settles."""
    stream = UIStream(run_id)
    yield {"type": "start", "messageId": run_id}
    first = True
    upto = 0  # the run's chunks before this seq are shown (from storage or live)
    live = False  # whether any chunk of the run streamed after the first snapshot
    ended: Snapshot | None = None  # settled, but chunks of it are still queued behind
    events = feed.events()
    while True:
        try:
            async with asyncio.timeout(None if ended is None else CHUNK_PATIENCE):
                item = await anext(events)
        except TimeoutError:
            # The chunks never came (lost without a gap to show it): end as committed.
            assert ended is not None
            for chunk in stream.finish(ended):
                yield chunk
            return
        if isinstance(item, Committed):
            run = item.snapshot.run
            own = run if run is not None and run.id == run_id else None
            if first:
                # Later steps stream live; only what committed before the stream opened is sent
                # from storage (a UI message stream cannot replace what it already sent).
                new = _unsent(item.snapshot, run_id, known)
                for chunk in _flatten(committed_chunks(m) for m in new):
                    yield chunk
                known = known | {m.id for m in new}
                upto = own.next_seq if own is not None else 0
                first = False
            if is_settled(item.snapshot, run_id):
                # A snapshot read after the run ended may come before the last chunks it
                # published (queued behind the invalidation that caused the read): they are
                # on their way, so wait for them, up to the next committed state (a reset, or
                # at most CHUNK_PATIENCE), rather than finish without the run's text.
                if (
                    own is None
                    or upto >= own.next_seq
                    or item.reset
                    or ended is not None
                    or not live
                ):
                    if not live:
                        # Its steps committed before any of their chunks reached this stream
                        # (published before it subscribed, the replay already cleared): sent
                        # from storage, as the steps before the stream opened were.
                        new = _unsent(item.snapshot, run_id, known)
                        for chunk in _flatten(committed_chunks(m) for m in new):
                            yield chunk
                    for chunk in stream.finish(item.snapshot):
                        yield chunk
                    return
                ended = item.snapshot
        elif item.run_id == run_id:
            upto, live = item.seq + 1, True
            for chunk in stream.chunk(item):
                yield chunk
            if ended is not None and ended.run is not None and upto >= ended.run.next_seq:
                for chunk in stream.finish(ended):
                    yield chunk
                return


def _unsent(snapshot: Snapshot, run_id: str, known: set[str]) -> list[MessageView]:
    """The run's committed assistant messages not in `known`."""
    return [
        m
        for m in snapshot.messages
        if m.run_id == run_id and m.role == "assistant" and m.id not in known
    ]


def _flatten(groups: Iterable[list[Part]]) -> Iterable[Part]:
    for group in groups:
        yield from group


def parse_chat(raw: bytes) -> ChatRequest:
    try:
        return ChatRequest.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise InvalidInput(
            "the body is not an AI SDK chat request", errors=validation_field_errors(exc)
        ) from exc
    except RecursionError as exc:
        raise InvalidInput("the body is nested too deeply") from exc


def respond(feed: ThreadFeed, parts: AsyncIterator[Part], thread_id: str) -> StreamingResponse:
    frames = (sse(part) async for part in parts)
    return sse_response(
        feed,
        frames,
        on_error=lambda exc: sse({"type": "error", "errorText": wire_error(exc).message}),
        # The chat's Threadline thread id, for the HTTP and websocket routes.
        headers={**HEADERS, THREAD_HEADER: thread_id},
        trailer=b"data: [DONE]\n\n",
    )


async def chat_endpoint(request: Request) -> Response:
    """`POST /v1/ai-sdk/chat`: the request as the table's commands, all checked and charged
    before any runs, then the stream of the run it started or resumed."""
    try:
        caller = await request_caller(request)
        chat = parse_chat(await read_body(request))
        thread = await open_thread(caller, chat.id, create=False)
        steps = plan(caller, thread.thread_id, chat, thread.snapshot)
        create = create_step(caller, chat.id, thread.snapshot)
        charged = await charge_together(caller, [*create, *steps])
        feed = await open_feed(request, caller, thread.thread_id, create, charged, append_only=True)
    except Exception as exc:
        return wire_error(exc).response()
    try:
        before = await feed.snapshot()
        run_id = await run_steps(charged, thread.thread_id, steps)
    except Exception as exc:
        await feed.__aexit__(None, None, None)
        return wire_error(exc).response()
    known = {m.id for m in before.messages}
    return respond(feed, stream_run(feed, run_id, known), thread.thread_id)


async def resume_endpoint(request: Request) -> Response:
    """`GET /v1/ai-sdk/chat/{id}/stream`: the run in flight from its start, or 204 (none)."""
    try:
        caller = await request_caller(request)
        thread = await open_thread(caller, request.path_params["thread_id"], create=False)
        snapshot = thread.snapshot
        if snapshot is None:
            raise NotFound(f"chat {request.path_params['thread_id']} not found")
        run = snapshot.run
        if run is None or is_settled(snapshot, run.id):
            return Response(status_code=204)
        feed = await open_feed(request, caller, thread.thread_id, append_only=True)
    except Exception as exc:
        return wire_error(exc).response()
    return respond(feed, stream_run(feed, run.id, set()), thread.thread_id)


async def stop_endpoint(request: Request) -> Response:
    """`POST /v1/ai-sdk/chat/{id}/stop`: the table's `run.stop` of the chat's last run. The
    SDK's `stop()` only aborts its fetch, which looks like a closed tab (the run goes on, for a
    reload to resume): this is the route a `useChat` app posts to stop it for everyone."""
    try:
        caller = await request_caller(request)
        chat_id = request.path_params["thread_id"]
        thread = await open_thread(caller, chat_id, create=False)
        run = thread.snapshot.run if thread.snapshot is not None else None
        if run is None:
            raise NotFound(f"chat {chat_id} has no run to stop")
        command = BY_NAME["run.stop"]
        data = command.parse(caller, {"thread_id": thread.thread_id, "run_id": run.id})
        answer = await command.run(caller, data)
    except Exception as exc:
        return wire_error(exc).response()
    return JSONResponse(answer, status_code=202)


def aisdk_routes() -> list[BaseRoute]:
    return [
        Route("/v1/ai-sdk/chat", chat_endpoint, methods=["POST"], name="ai_sdk_chat"),
        Route(
            "/v1/ai-sdk/chat/{thread_id}/stream",
            resume_endpoint,
            methods=["GET"],
            name="ai_sdk_resume",
        ),
        Route(
            "/v1/ai-sdk/chat/{thread_id}/stop", stop_endpoint, methods=["POST"], name="ai_sdk_stop"
        ),
    ]
