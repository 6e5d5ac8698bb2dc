"""A local HTTP server that speaks OpenAI's and Anthropic's streaming wire formats, for tests."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.providers.anthropic import AnthropicModel
from runtime.providers.openai_compat import OpenAICompatModel

# --- what the server answers ---------------------------------------------------------------------


@dataclass(frozen=True)
class SSEReply:
    """A 200 `text/event-stream` response made of raw SSE events."""

    events: Sequence[bytes]
    # Drop the connection after this many events, leaving the chunked body unfinished.
    abort_after: int | None = None


@dataclass(frozen=True)
class StatusReply:
    status: int
    body: dict[str, Any]


Reply = SSEReply | StatusReply


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _Abort(Exception):
    """Raised inside the response body: uvicorn then closes the connection mid-response."""


@dataclass
class WireServer:
    """Uvicorn on 127.0.0.1 (a free port) in a thread of its own. Tests queue replies with
    `reply()` and read what the SDKs sent from `received`."""

    replies: deque[Reply] = field(default_factory=deque)
    received: list[Received] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        routes = [
            Route("/v1/chat/completions", self._handle, methods=["POST"]),
            Route("/v1/messages", self._handle, methods=["POST"]),
        ]
        self.app = Starlette(routes=routes)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reply(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def reset(self) -> None:
        self.replies.clear()
        self.received.clear()

    async def _handle(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(Received(request.url.path, dict(request.headers), body))
        if not self.replies:
            return JSONResponse({"error": {"message": "no reply scripted"}}, status_code=418)
        reply = self.replies.popleft()
        if isinstance(reply, StatusReply):
            return JSONResponse(reply.body, status_code=reply.status)
        return StreamingResponse(_events(reply), media_type="text/event-stream")

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="critical", lifespan="off", ws="none", access_log=False
        )
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("wire server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()


async def _events(reply: SSEReply) -> AsyncIterator[bytes]:
    for n, event in enumerate(reply.events):
        if reply.abort_after is not None and n >= reply.abort_after:
            raise _Abort
        yield event
        # Let each event leave in its own write, as a real server streams them.
        await asyncio.sleep(0.001)
    if reply.abort_after is not None:
        raise _Abort


def closed_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- OpenAI chat.completion.chunk stream --------------------------------------------------------


def sse_data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def sse_event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


OPENAI_DONE = b"data: [DONE]\n\n"


def openai_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    return sse_data(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "gpt-test",
            "system_fingerprint": "fp_test",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": None,
        }
    )


def openai_usage(prompt: int, completion: int) -> bytes:
    return sse_data(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "gpt-test",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )


def openai_text_events(pieces: Sequence[str]) -> list[bytes]:
    first = openai_chunk({"role": "assistant", "content": "", "refusal": None})
    return [first, *(openai_chunk({"content": piece}) for piece in pieces)]


def openai_tool_events(
    calls: Sequence[tuple[str, str, Sequence[str]]], text: Sequence[str] = ()
) -> list[bytes]:
    """Each call as (id, name, argument fragments): id, name and "" first, then fragments."""
    events = openai_text_events(text) if text else [openai_chunk({"role": "assistant"})]
    for index, (call_id, name, fragments) in enumerate(calls):
        opening = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        events.append(openai_chunk({"tool_calls": [opening]}))
        for fragment in fragments:
            fragment_delta = {"index": index, "function": {"arguments": fragment}}
            events.append(openai_chunk({"tool_calls": [fragment_delta]}))
    return events


def openai_error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# --- Anthropic Messages stream ------------------------------------------------------------------


def anthropic_message_start(input_tokens: int) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-test",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return sse_event("message_start", {"type": "message_start", "message": message})


def anthropic_text_block(index: int, pieces: Sequence[str]) -> list[bytes]:
    start = {
        "type": "content_block_start",
        "index": index,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [
        sse_event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
        for piece in pieces
    ]
    stop = sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
    return [sse_event("content_block_start", start), ANTHROPIC_PING, *deltas, stop]


def anthropic_tool_block(
    index: int, call_id: str, name: str, fragments: Sequence[str]
) -> list[bytes]:
    start = {
        "type": "content_block_start",
        "index": index,
        "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
    }
    deltas = [
        sse_event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": fragment},
            },
        )
        for fragment in fragments
    ]
    stop = sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
    return [sse_event("content_block_start", start), *deltas, stop]


def anthropic_message_end(stop_reason: str, output_tokens: int) -> list[bytes]:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    return [
        sse_event("message_delta", delta),
        sse_event("message_stop", {"type": "message_stop"}),
    ]


ANTHROPIC_PING = sse_event("ping", {"type": "ping"})


def anthropic_error_event(kind: str, message: str) -> bytes:
    return sse_event("error", anthropic_error_body(kind, message))


def anthropic_error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- one adapter per vendor, so the tests are written once -------------------------------------

Calls = Sequence[tuple[str, str, Sequence[str]]]


class OpenAIVendor:
    name = "openai"

    def model(self, url: str) -> OpenAICompatModel:
        return OpenAICompatModel("gpt-test", base_url=f"{url}/v1", api_key="sk-test", max_retries=0)

    def text_reply(self, pieces: Sequence[str], usage: tuple[int, int]) -> SSEReply:
        end = [openai_chunk({}, "stop"), openai_usage(*usage), OPENAI_DONE]
        return SSEReply([*openai_text_events(pieces), *end])

    def tool_reply(self, calls: Calls, text: Sequence[str] = ()) -> SSEReply:
        end = [openai_chunk({}, "tool_calls"), openai_usage(9, 9), OPENAI_DONE]
        return SSEReply([*openai_tool_events(calls, text), *end])

    def error_mid_stream(self, pieces: Sequence[str]) -> SSEReply:
        error = sse_data(openai_error_body("The server had an error", "server_error"))
        return SSEReply([*openai_text_events(pieces), error])

    def dropped_mid_stream(self, pieces: Sequence[str]) -> SSEReply:
        events = openai_text_events(pieces)
        return SSEReply([*events, OPENAI_DONE], abort_after=len(events))

    def status_reply(self, status: int) -> StatusReply:
        return StatusReply(status, openai_error_body(f"status {status}", "server_error"))


class AnthropicVendor:
    name = "anthropic"

    def model(self, url: str) -> AnthropicModel:
        return AnthropicModel("claude-test", base_url=url, api_key="sk-ant-test", max_retries=0)

    def text_reply(self, pieces: Sequence[str], usage: tuple[int, int]) -> SSEReply:
        return SSEReply(
            [
                anthropic_message_start(usage[0]),
                *anthropic_text_block(0, pieces),
                *anthropic_message_end("end_turn", usage[1]),
            ]
        )

    def tool_reply(self, calls: Calls, text: Sequence[str] = ()) -> SSEReply:
        events = [anthropic_message_start(9)]
        offset = 1 if text else 0
        if text:
            events.extend(anthropic_text_block(0, text))
        for n, (call_id, name, fragments) in enumerate(calls):
            events.extend(anthropic_tool_block(n + offset, call_id, name, fragments))
        return SSEReply([*events, *anthropic_message_end("tool_use", 9)])

    def error_mid_stream(self, pieces: Sequence[str]) -> SSEReply:
        partial = [anthropic_message_start(3), *anthropic_text_block(0, pieces)[:-1]]
        return SSEReply([*partial, anthropic_error_event("overloaded_error", "Overloaded")])

    def dropped_mid_stream(self, pieces: Sequence[str]) -> SSEReply:
        events = [anthropic_message_start(3), *anthropic_text_block(0, pieces)[:-1]]
        return SSEReply(events, abort_after=len(events))

    def status_reply(self, status: int) -> StatusReply:
        kinds = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}
        return StatusReply(status, anthropic_error_body(kinds.get(status, "api_error"), "failed"))


Vendor = OpenAIVendor | AnthropicVendor
