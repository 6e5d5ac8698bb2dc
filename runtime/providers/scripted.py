"""Deterministic models for tests: a scripted model that records its calls, and a function model."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from runtime.providers.model_api import (
    FinishDelta,
    ModelDelta,
    ModelRequest,
    ProviderError,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)


@dataclass(frozen=True)
class FailMidStream:
    """A scripted response that yields `deltas`, then raises `error` while being consumed."""

    deltas: Sequence[ModelDelta]
    error: BaseException


ScriptedResponse: TypeAlias = (
    Sequence[ModelDelta]
    | BaseException
    | FailMidStream
    | Callable[[ModelRequest], "Sequence[ModelDelta] | BaseException | FailMidStream"]
)


class ScriptedModel:
    """Plays back one scripted response per call, in order.

    Every request is recorded in `calls`. A call beyond the script raises AssertionError and is
    remembered, so `assert_consumed()` fails the test even if the runtime swallowed the error.
    An exception scripted as a whole response is raised when the stream is first iterated, the
    way a provider's setup failure surfaces; `FailMidStream` raises after its deltas.
    """

    def __init__(
        self, responses: Iterable[ScriptedResponse], *, name: str = "scripted", delay: float = 0.0
    ) -> None:
        self.name = name
        self.delay = delay
        self._responses: list[ScriptedResponse] = list(responses)
        self._next = 0
        self.calls: list[ModelRequest] = []
        self.unexpected_calls: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        return len(self._responses) - self._next

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        self.calls.append(request)
        if self._next >= len(self._responses):
            self.unexpected_calls.append(request)
            raise AssertionError(
                f"{self.name}: unexpected model call #{len(self.calls)} "
                f"(script has {len(self._responses)} responses)"
            )
        response = self._responses[self._next]
        self._next += 1
        if callable(response) and not isinstance(response, BaseException):
            response = response(request)
        return _play(response, self.delay)

    def assert_consumed(self) -> None:
        assert not self.unexpected_calls, (
            f"{self.name}: {len(self.unexpected_calls)} unexpected model call(s)"
        )
        assert self.remaining == 0, (
            f"{self.name}: {self.remaining} scripted response(s) never requested "
            f"({len(self.calls)} call(s) made)"
        )

    def last_request(self) -> ModelRequest:
        assert self.calls, f"{self.name}: no model call was made"
        return self.calls[-1]


async def _play(
    response: Sequence[ModelDelta] | BaseException | FailMidStream, delay: float
) -> AsyncIterator[ModelDelta]:
    if isinstance(response, BaseException):
        raise response
    error: BaseException | None = None
    deltas: Sequence[ModelDelta] = response if not isinstance(response, FailMidStream) else ()
    if isinstance(response, FailMidStream):
        deltas, error = response.deltas, response.error
    for index, delta in enumerate(deltas):
        if index:
            # Yield control between deltas even without delay, so concurrent consumers interleave
            # the way they would with a network-backed stream.
            await asyncio.sleep(delay)
        yield delta
    if error is not None:
        await asyncio.sleep(delay)
        raise error


FunctionResult: TypeAlias = AsyncIterator[ModelDelta] | Iterable[ModelDelta]
ModelFunction: TypeAlias = Callable[
    [ModelRequest], FunctionResult | Awaitable[Iterable[ModelDelta]]
]


class FunctionModel:
    """A model whose responses come from `fn(request)`: an async iterator (an `async def` with
    `yield`), an iterable of deltas, or an awaitable of one. Requests are recorded in `calls`."""

    def __init__(self, fn: ModelFunction, *, name: str = "function") -> None:
        self.fn = fn
        self.name = name
        self.calls: list[ModelRequest] = []

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        self.calls.append(request)
        return self._run(request)

    async def _run(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        result: Any = self.fn(request)
        if inspect.isawaitable(result):
            result = await result
        if hasattr(result, "__aiter__"):
            async for delta in result:
                yield delta
            return
        for delta in result:
            await asyncio.sleep(0)
            yield delta


# --- response builders ------------------------------------------------------------------------


def split_text(text: str, chunks: int) -> list[str]:
    """`text` in `chunks` nearly equal consecutive pieces (fewer if the text is shorter)."""
    if not text:
        return []
    chunks = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), chunks)
    pieces, start = [], 0
    for i in range(chunks):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def _usage(usage: tuple[int, int] | None) -> list[ModelDelta]:
    return [] if usage is None else [UsageDelta(input_tokens=usage[0], output_tokens=usage[1])]


def text_response(
    text: str,
    chunks: int = 1,
    *,
    usage: tuple[int, int] | None = (1, 1),
    finish: str = "stop",
) -> list[ModelDelta]:
    """A text answer streamed in `chunks` TextDeltas, then usage and a finish reason."""
    deltas: list[ModelDelta] = [TextDelta(text=piece) for piece in split_text(text, chunks)]
    return [*deltas, *_usage(usage), FinishDelta(reason=finish)]


@dataclass(frozen=True)
class ScriptedToolCall:
    name: str
    input: Mapping[str, Any]
    id: str | None = None
    # Arguments arrive in this many fragments, like a real provider splits them.
    fragments: int = 2


def tool_call_deltas(call: ScriptedToolCall, index: int) -> list[ModelDelta]:
    arguments = json.dumps(dict(call.input))
    pieces = split_text(arguments, call.fragments) or [""]
    first = ToolCallDelta(index=index, id=call.id, name=call.name, arguments=pieces[0])
    return [first, *(ToolCallDelta(index=index, arguments=piece) for piece in pieces[1:])]


def tool_calls_response(
    *calls: ScriptedToolCall,
    text: str = "",
    usage: tuple[int, int] | None = (1, 1),
    finish: str = "tool_calls",
) -> list[ModelDelta]:
    """Optional text, then every call with its arguments split into fragments."""
    deltas: list[ModelDelta] = [TextDelta(text=text)] if text else []
    for index, call in enumerate(calls):
        deltas.extend(tool_call_deltas(call, index))
    return [*deltas, *_usage(usage), FinishDelta(reason=finish)]


def tool_call_response(
    name: str,
    input: Mapping[str, Any] | None = None,
    id: str | None = None,
    *,
    text: str = "",
    fragments: int = 2,
    usage: tuple[int, int] | None = (1, 1),
) -> list[ModelDelta]:
    """A response that makes one tool call."""
    call = ScriptedToolCall(name, input or {}, id, fragments)
    return tool_calls_response(call, text=text, usage=usage)


def fail_mid_stream(
    deltas: Sequence[ModelDelta], error: BaseException | None = None
) -> FailMidStream:
    """Yield `deltas`, then fail (by default with a retryable ProviderError)."""
    return FailMidStream(
        list(deltas), error or ProviderError("scripted mid-stream failure", retryable=True)
    )
