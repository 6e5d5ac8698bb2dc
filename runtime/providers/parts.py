"""Step assembly: the one path that turns any provider's normalised deltas into a step result."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.providers.model_api import (
    FinishDelta,
    ModelDelta,
    ResponseDelta,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)

# --- what feed() reports ----------------------------------------------------------------------


@dataclass(frozen=True)
class TextAppended:
    """Model text to stream now."""

    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    """The first fragment of a tool call arrived. `id` is None when the provider has not sent one
    yet; the assembled call then carries the provider's later id or a generated one."""

    index: int
    id: str | None
    name: str | None


@dataclass(frozen=True)
class ToolCallArgumentsAppended:
    index: int
    fragment: str


@dataclass(frozen=True)
class UsageUpdated:
    """Running totals after this delta (not the increment)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class FinishReceived:
    reason: str


StepEvent = (
    TextAppended | ToolCallStarted | ToolCallArgumentsAppended | UsageUpdated | FinishReceived
)


# --- what result() returns --------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class AssembledToolCall:
    """A complete tool call. `error` is set (and `input` is empty) when the call is unusable:
    invalid JSON arguments, arguments that are not an object, or no tool name."""

    id: str
    name: str
    input: dict[str, Any]
    error: str | None = None
    raw_arguments: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class AssembledStep:
    text: str
    tool_calls: list[AssembledToolCall]
    usage: Usage
    finish_reason: str | None


def generate_tool_call_id() -> str:
    # Anthropic requires ids matching [a-zA-Z0-9_-]+; OpenAI accepts anything.
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class _PendingCall:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    # Fixed once at result() time so repeated result() calls agree on a generated id.
    generated_id: str | None = None


class StepAssembler:
    """Accumulates the deltas of one model response.

    Providers normalise their wire events into ModelDelta; the step loop feeds every delta here
    and streams the returned events. Nothing here raises on malformed model output: a broken tool
    call is reported on that call (`AssembledToolCall.error`) so the run can show it to the model.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _PendingCall] = {}
        self._input_tokens = 0
        self._output_tokens = 0
        self._finish_reason: str | None = None

    def feed(self, delta: ModelDelta) -> list[StepEvent]:
        if isinstance(delta, TextDelta):
            if not delta.text:
                return []
            self._text.append(delta.text)
            return [TextAppended(delta.text)]
        if isinstance(delta, ToolCallDelta):
            return self._feed_tool_call(delta)
        if isinstance(delta, UsageDelta):
            self._input_tokens += delta.input_tokens
            self._output_tokens += delta.output_tokens
            return [UsageUpdated(self._input_tokens, self._output_tokens)]
        if isinstance(delta, FinishDelta):
            # The last reason wins: some servers repeat it on the trailing usage chunk.
            self._finish_reason = delta.reason
            return [FinishReceived(delta.reason)]
        if isinstance(delta, ResponseDelta):
            return []  # for traces only
        raise TypeError(f"not a model delta: {delta!r}")

    def feed_all(self, deltas: list[ModelDelta]) -> list[StepEvent]:
        events: list[StepEvent] = []
        for delta in deltas:
            events.extend(self.feed(delta))
        return events

    def _feed_tool_call(self, delta: ToolCallDelta) -> list[StepEvent]:
        events: list[StepEvent] = []
        call = self._calls.get(delta.index)
        if call is None:
            call = self._calls[delta.index] = _PendingCall(delta.index, delta.id, delta.name)
            events.append(ToolCallStarted(delta.index, delta.id, delta.name))
        else:
            # Providers may repeat id and name on later fragments; the first value wins so a
            # repeat never doubles a name the way naive concatenation would.
            if call.id is None and delta.id:
                call.id = delta.id
            if call.name is None and delta.name:
                call.name = delta.name
        if delta.arguments:
            call.arguments.append(delta.arguments)
            events.append(ToolCallArgumentsAppended(delta.index, delta.arguments))
        return events

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def usage(self) -> Usage:
        return Usage(self._input_tokens, self._output_tokens)

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    def result(self) -> AssembledStep:
        """The step so far; tool calls ordered by index. Safe to call more than once."""
        calls = [self._assemble(self._calls[i]) for i in sorted(self._calls)]
        return AssembledStep(
            text=self.text,
            tool_calls=calls,
            usage=self.usage,
            finish_reason=self._finish_reason,
        )

    def _assemble(self, call: _PendingCall) -> AssembledToolCall:
        if call.id:
            call_id = call.id
        else:
            if call.generated_id is None:
                call.generated_id = generate_tool_call_id()
            call_id = call.generated_id
        raw = "".join(call.arguments)
        name = call.name or ""
        if not name:
            return AssembledToolCall(call_id, name, {}, "tool call has no name", raw)
        parsed, error = parse_tool_arguments(name, raw)
        return AssembledToolCall(call_id, name, parsed, error, raw)


def parse_tool_arguments(name: str, raw: str) -> tuple[dict[str, Any], str | None]:
    """Parse a tool call's JSON arguments; `({}, message)` when they are unusable."""
    if not raw.strip():
        # Models send no arguments at all for parameterless tools.
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, (
            f"invalid JSON arguments for tool {name!r}: {exc.msg} "
            f"(line {exc.lineno}, column {exc.colno})"
        )
    if not isinstance(value, dict):
        return {}, (f"arguments for tool {name!r} must be a JSON object, got {_json_type(value)}")
    return value, None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__
