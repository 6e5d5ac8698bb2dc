"""Provider-independent reading of model context: turns of a message and tool-result text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.domain import Part, TextPart, ToolCallPart, ToolState


@dataclass(frozen=True)
class Turn:
    """One model turn inside a stored message: its text, then the tool calls it made.

    The runtime stores one assistant message per step, but a message may still hold
    `text, tool call, text, …` (written by other tools or older data); wire formats need one
    assistant turn per step, each followed by the results of its calls.
    """

    text: str
    tool_calls: tuple[ToolCallPart, ...] = ()


def message_turns(parts: Sequence[Part]) -> list[Turn]:
    """Split a message's parts into turns; text after a tool call starts a new turn."""
    turns: list[Turn] = []
    text: list[str] = []
    calls: list[ToolCallPart] = []
    for part in parts:
        if isinstance(part, TextPart):
            if calls:
                turns.append(Turn("".join(text), tuple(calls)))
                text, calls = [], []
            text.append(part.text)
        elif isinstance(part, ToolCallPart):
            calls.append(part)
    if text or calls:
        turns.append(Turn("".join(text), tuple(calls)))
    return turns


def message_text(parts: Sequence[Part]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart))


@dataclass(frozen=True)
class ToolResultContent:
    text: str
    is_error: bool


_NO_RESULT = {
    ToolState.INPUT_AVAILABLE: "the tool call has not produced a result",
    ToolState.RUNNING: "the tool call has not produced a result",
    ToolState.AWAITING_ACTION: "the tool call is waiting for a human and has no result yet",
    ToolState.SKIPPED: "the tool call was skipped",
    ToolState.REJECTED: "the tool call was rejected",
    ToolState.CANCELLED: "the tool call was cancelled",
    ToolState.OUTPUT_ERROR: "the tool call failed",
}


def tool_result_content(part: ToolCallPart) -> ToolResultContent:
    """The model-visible result of a tool part in any state.

    Every tool call in context needs a result on the wire (OpenAI and Anthropic reject a call
    without one), so parts that never produced output (waiting, cancelled, rejected) still get
    a text: their error or output when they have one, else a sentence saying what happened.
    """
    state = part.state
    if state is ToolState.OUTPUT_AVAILABLE:
        return ToolResultContent(render_output(part.output), False)
    is_error = state in (ToolState.OUTPUT_ERROR, ToolState.REJECTED, ToolState.CANCELLED)
    if part.error:
        return ToolResultContent(f"{_NO_RESULT[state]}: {part.error}", is_error)
    if part.output is not None:
        return ToolResultContent(render_output(part.output), is_error)
    return ToolResultContent(_NO_RESULT[state], is_error)


def render_output(output: Any) -> str:
    if isinstance(output, str):
        return output
    return json.dumps(output, ensure_ascii=False, default=str)
