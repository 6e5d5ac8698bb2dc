"""The AI SDK's UI message stream (`DefaultChatTransport`): chat POST and the resume GET."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from runtime.domain import (
    InputPolicy,
    MessageView,
    Principal,
    RunStatus,
    Snapshot,
    TextPart,
    ToolCallPart,
    ToolState,
    WaitKind,
)
from runtime.errors import InvalidInput, RunActive
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

Part = dict[str, Any]
HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}  # with streams.SSE_HEADERS
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


@dataclass
class UIStream:
    """One run's canonical chunks as UI message chunks (the state of the open text part)."""

    run_id: str
    text_id: str | None = None
    texts: int = 0

    def chunk(self, chunk: Chunk) -> list[Part]:
        data = chunk.chunk
        kind = data.get("type")
        if kind == "step-start":
            return [{"type": "start-step"}]
        if kind == "step-finish":
            return [*self.close_text(), {"type": "finish-step"}]
        if kind == "text-delta" and data.get("delta"):
            out: list[Part] = []
            if self.text_id is None:
                self.texts += 1
                self.text_id = f"{chunk.run_id}-{self.texts}"
                out.append({"type": "text-start", "id": self.text_id})
            return [*out, {"type": "text-delta", "id": self.text_id, "delta": data["delta"]}]
        if kind == "tool-call":
            return [
                *self.close_text(),
                *_tool_call(data["tool_call_id"], data["name"], data["input"]),
            ]
        if kind == "tool-state":
            part = ToolCallPart(
                tool_call_id=data["tool_call_id"],
                name="tool",
                state=ToolState(data["state"]),
                output=data.get("output"),
                error=data.get("error"),
            )
            final = _final_chunk(part)
            return [] if final is None else [*self.close_text(), final]
        return []

    def close_text(self) -> list[Part]:
        if self.text_id is None:
            return []
        text_id, self.text_id = self.text_id, None
        return [{"type": "text-end", "id": text_id}]

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


async def act(
    service: ThreadService, principal: Principal, chat: ChatRequest, snapshot: Snapshot
) -> str | None:
    """Apply the request: approval responses and client tool outputs, a regenerate, or a
    new user message. Returns the run to stream (None: nothing to stream)."""
    thread_id = chat.id
    if chat.trigger == "regenerate-message":
        return (await service.regenerate(principal, thread_id)).run_id
    last = chat.messages[-1] if chat.messages else None
    if last is None:
        raise InvalidInput("messages must not be empty")
    if last.role == "user":
        # A chat shows one response at a time: a message for a busy thread is refused (by the
        # store, before anything changes), never queued behind a run it could not stream.
        admission = await service.send_message(
            principal,
            thread_id,
            _text(last),
            client_request_id=last.id,
            policy=InputPolicy.REJECT,
        )
        if admission.run_id is None:  # a retried request whose first one was queued
            raise RunActive("the message waits in the queue: no run to stream yet")
        return admission.run_id
    pending = {a.id: a for a in snapshot.pending_actions}
    by_call = {a.tool_call_id: a for a in pending.values()}
    run_id: str | None = None
    for part in last.parts:
        approval = part.get("approval")
        call_id = str(part.get("toolCallId", ""))
        if part.get("state") == "approval-responded" and isinstance(approval, dict):
            payload: dict[str, Any] = {"approved": bool(approval.get("approved"))}
            if approval.get("reason"):
                payload["note"] = str(approval["reason"])
            result = await service.resume_action(
                principal, thread_id, str(approval.get("id", "")), payload
            )
            run_id = result.run_id or run_id
        elif (
            part.get("state") in ("output-available", "output-error")
            and call_id in by_call
            and by_call[call_id].kind is WaitKind.CLIENT_TOOL
        ):
            payload = {"output": part.get("output"), "error": part.get("errorText")}
            result = await service.resume_action(
                principal, thread_id, by_call[call_id].id, payload, kind=WaitKind.CLIENT_TOOL
            )
            run_id = result.run_id or run_id
    if run_id is None:
        raise InvalidInput("the last message answers no pending action of this chat")
    return run_id


async def stream_run(feed: ThreadFeed, run_id: str, known: set[str]) -> AsyncIterator[Part]:
    """`start`, then the run's committed steps the client lacks (ids not in `known`), the
    in-flight step's replay, live chunks, and `finish` once the run settles."""
    stream = UIStream(run_id)
    yield {"type": "start", "messageId": run_id}
    first = True
    async for item in feed.events():
        if isinstance(item, Committed):
            if first:
                # Later steps stream live; only what committed before the stream opened is sent
                # from storage (a UI message stream cannot replace what it already sent).
                new = [
                    m
                    for m in item.snapshot.messages
                    if m.run_id == run_id and m.role == "assistant" and m.id not in known
                ]
                for chunk in _flatten(committed_chunks(m) for m in new):
                    yield chunk
                first = False
            if is_settled(item.snapshot, run_id):
                for chunk in stream.finish(item.snapshot):
                    yield chunk
                return
        elif item.run_id == run_id:
            for chunk in stream.chunk(item):
                yield chunk


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


def respond(feed: ThreadFeed, parts: AsyncIterator[Part]) -> StreamingResponse:
    frames = (sse(part) async for part in parts)
    return sse_response(
        feed,
        frames,
        on_error=lambda exc: sse({"type": "error", "errorText": wire_error(exc).message}),
        headers=HEADERS,
        trailer=b"data: [DONE]\n\n",
    )


async def chat_endpoint(request: Request) -> Response:
    """`POST /v1/ai-sdk/chat`: apply the request, then stream the run it started or resumed."""
    try:
        service, principal = await caller_of(request)
        chat = parse_chat(await read_body(request))
        feed = await open_feed(request, service, principal, chat.id, create=True)
    except Exception as exc:
        return wire_error(exc).response()
    try:
        before = await feed.snapshot()
        run_id = await act(service, principal, chat, before)
    except Exception as exc:
        await feed.__aexit__(None, None, None)
        return wire_error(exc).response()
    assert run_id is not None
    known = {m.id for m in before.messages}
    return respond(feed, stream_run(feed, run_id, known))


async def resume_endpoint(request: Request) -> Response:
    """`GET /v1/ai-sdk/chat/{id}/stream`: the run in flight from its start, or 204 (none)."""
    try:
        service, principal = await caller_of(request)
        thread_id = request.path_params["thread_id"]
        snapshot = await service.snapshot(principal, thread_id)
    except Exception as exc:
        return wire_error(exc).response()
    run = snapshot.run
    if run is None or is_settled(snapshot, run.id):
        return Response(status_code=204)
    feed = await open_feed(request, service, principal, thread_id)
    return respond(feed, stream_run(feed, run.id, set()))


def aisdk_routes() -> list[BaseRoute]:
    return [
        Route("/v1/ai-sdk/chat", chat_endpoint, methods=["POST"], name="ai_sdk_chat"),
        Route(
            "/v1/ai-sdk/chat/{thread_id}/stream",
            resume_endpoint,
            methods=["GET"],
            name="ai_sdk_resume",
        ),
    ]
