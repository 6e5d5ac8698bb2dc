"""Campaign clients on the SSE transports: AG-UI (`POST /v1/ag-ui`) and the AI SDK UI message
stream (`POST /v1/ai-sdk/chat`, `GET /v1/ai-sdk/chat/{id}/stream`), read with httpx-sse.

A send through either is one more `send` of the history (its marker in the text, its message id
as the `client_request_id`), so the checker's exactly-once rule covers it; every event a stream
carried is recorded (`History.streams`) for the checker's stream rules (`stream_rules.py`)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
from httpx_sse import SSEError, aconnect_sse

from tests.campaign.history import History, Op, Stream
from tests.e2e.run_inputs import agui_input

STREAM_PATIENCE = 8.0  # a stream still open past this is abandoned (its outcome stays known)
MAX_EVENTS = 5000  # a bound on what one stream may carry


def classify(status: int) -> tuple[str, bool]:
    """(outcome, body is a stream) for an HTTP status, as `Client.call` classifies answers."""
    if status < 300:
        return "ok", True
    return ("fail" if status < 500 else "unknown"), False


async def read_stream(
    http: httpx.AsyncClient,
    history: History,
    op: Op | None,
    stream: Stream,
    method: str,
    url: str,
    token: str,
    body: Any,
) -> None:
    """POST/GET an SSE route and record every event of its answer in `stream`. With `op` (a
    send), the op completes as soon as the server said whether it acted: AI SDK with its
    status; AG-UI with its second event (RUN_ERROR right after RUN_STARTED: refused)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    timeout = httpx.Timeout(4.0, read=STREAM_PATIENCE)
    kwargs: dict[str, Any] = {"headers": headers, "timeout": timeout}
    if body is not None:
        kwargs["json"] = body
    deadline = time.monotonic() + STREAM_PATIENCE
    try:
        async with aconnect_sse(http, method, url, **kwargs) as source:
            response = source.response
            stream.status = response.status_code
            outcome, streaming = classify(response.status_code)
            if not streaming:
                await response.aread()
                if op is not None:
                    History.complete(op, outcome, response.status_code, _json(response.content))  # type: ignore[arg-type]
                return
            if op is not None and stream.transport == "ai-sdk":
                History.complete(op, "ok", response.status_code, {"stream": stream.name})
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    stream.done = True
                    continue
                stream.events.append(dict(orjson.loads(event.data)))
                if op is not None and op.outcome is None and len(stream.events) >= 2:
                    _agui_answer(op, stream)
                if len(stream.events) >= MAX_EVENTS or time.monotonic() > deadline:
                    return
            stream.closed = True
    except (httpx.HTTPError, SSEError, ValueError) as exc:
        stream.error = repr(exc)
        if op is not None and op.outcome is None:
            connect = isinstance(exc, httpx.ConnectError)
            History.complete(op, "fail" if connect else "unknown", stream.status, repr(exc))
    finally:
        stream.end = time.monotonic()
        if op is not None and op.outcome is None:
            History.complete(op, "unknown", stream.status, "the stream ended early")


def _agui_answer(op: Op, stream: Stream) -> None:
    second = stream.events[1]
    if second.get("type") != "RUN_ERROR":
        History.complete(op, "ok", stream.status, {"stream": stream.name})
    elif second.get("code") == "unavailable":
        History.complete(op, "unknown", stream.status, second)
    else:
        History.complete(op, "fail", stream.status, second)


def _json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return content[:200].decode(errors="replace")


def agui_body(thread_id: str, message_id: str, text: str) -> dict[str, Any]:
    """An AG-UI run saying `text` as message `message_id` (its `client_request_id`)."""
    body = agui_input(thread_id, text)
    body["messages"][0]["id"] = message_id
    return body


def aisdk_body(thread_id: str, message_id: str, text: str) -> dict[str, Any]:
    """`DefaultChatTransport`'s submit-message body for chat `thread_id`."""
    message = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": thread_id, "messages": [message], "trigger": "submit-message"}
