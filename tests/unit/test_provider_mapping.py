"""Provider conversions without I/O: vendor events to deltas, context to turns and tool results."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest

from runtime.domain import MessageRole, TextPart, ToolCallPart, ToolState
from runtime.providers.anthropic import _CREATE_PARAMS as anthropic_create_params
from runtime.providers.anthropic import AnthropicModel, EventMapper
from runtime.providers.model_api import (
    ContextMessage,
    FinishDelta,
    ModelRequest,
    ResponseDelta,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from runtime.providers.model_context import message_turns, tool_result_content
from runtime.providers.openai_compat import OpenAICompatModel, chunk_deltas


def usage(**fields: Any) -> NS:
    return NS(**fields)


def test_anthropic_running_usage_totals_become_increments() -> None:
    mapper = EventMapper()
    start = NS(
        type="message_start",
        message=NS(usage=usage(input_tokens=10, cache_read_input_tokens=5, output_tokens=1)),
    )
    assert mapper.map(start) == [UsageDelta(input_tokens=15, output_tokens=1)]
    end = NS(
        type="message_delta",
        delta=NS(stop_reason="max_tokens"),
        usage=usage(output_tokens=20),
    )
    assert mapper.map(end) == [
        UsageDelta(input_tokens=0, output_tokens=19),
        FinishDelta(reason="length"),
    ]


def test_anthropic_message_start_names_the_response_for_traces() -> None:
    start = NS(
        type="message_start",
        message=NS(id="msg_1", model="claude-x", usage=usage(input_tokens=3, output_tokens=0)),
    )
    assert EventMapper().map(start) == [
        ResponseDelta(id="msg_1", model="claude-x"),
        UsageDelta(input_tokens=3, output_tokens=0),
    ]


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_anthropic_stop_reasons(stop: str, finish: str) -> None:
    event = NS(type="message_delta", delta=NS(stop_reason=stop), usage=None)
    assert EventMapper().map(event) == [FinishDelta(reason=finish)]


def test_anthropic_blocks() -> None:
    mapper = EventMapper()
    tool = NS(
        type="content_block_start",
        index=2,
        content_block=NS(type="tool_use", id="toolu_1", name="lookup"),
    )
    assert mapper.map(tool) == [ToolCallDelta(index=2, id="toolu_1", name="lookup")]
    text = NS(type="content_block_start", index=0, content_block=NS(type="text", text="Hi"))
    assert mapper.map(text) == [TextDelta(text="Hi")]
    thinking = NS(type="content_block_delta", index=1, delta=NS(type="thinking_delta"))
    assert mapper.map(thinking) == []
    assert mapper.map(NS(type="message_stop")) == []


def test_openai_chunks() -> None:
    call = NS(index=None, id="c1", function=NS(name="f", arguments='{"a"'))
    chunk = NS(
        choices=[
            NS(index=0, delta=NS(content="x", tool_calls=[call]), finish_reason="tool_calls"),
            NS(index=1, delta=NS(content="other choice", tool_calls=None), finish_reason=None),
        ],
        usage=NS(prompt_tokens=3, completion_tokens=None),
    )
    assert chunk_deltas(chunk) == [
        TextDelta(text="x"),
        ToolCallDelta(index=0, id="c1", name="f", arguments='{"a"'),
        FinishDelta(reason="tool_calls"),
        UsageDelta(input_tokens=3, output_tokens=0),
    ]


def test_message_turns_split_after_tool_calls() -> None:
    a = ToolCallPart(tool_call_id="a", name="t")
    b = ToolCallPart(tool_call_id="b", name="t")
    parts = (TextPart(text="one"), a, b, TextPart(text="two"), TextPart(text="!"))
    turns = message_turns(parts)
    assert [(t.text, [c.tool_call_id for c in t.tool_calls]) for t in turns] == [
        ("one", ["a", "b"]),
        ("two!", []),
    ]
    assert [t.tool_calls for t in message_turns((a,))] == [(a,)]


@pytest.mark.parametrize(
    ("state", "fields", "text", "is_error"),
    [
        (ToolState.OUTPUT_AVAILABLE, {"output": {"x": 1}}, '{"x": 1}', False),
        (ToolState.OUTPUT_AVAILABLE, {"output": "plain"}, "plain", False),
        (ToolState.OUTPUT_ERROR, {"error": "boom"}, "the tool call failed: boom", True),
        (ToolState.SKIPPED, {"output": {"cached": True}}, '{"cached": true}', False),
        (ToolState.SKIPPED, {}, "the tool call was skipped", False),
        (ToolState.REJECTED, {"error": "policy"}, "the tool call was rejected: policy", True),
        (ToolState.CANCELLED, {}, "the tool call was cancelled", True),
        (
            ToolState.AWAITING_ACTION,
            {},
            "the tool call is waiting for a human and has no result yet",
            False,
        ),
    ],
)
def test_tool_result_content(
    state: ToolState, fields: dict[str, Any], text: str, is_error: bool
) -> None:
    part = ToolCallPart(tool_call_id="c", name="t", state=state, **fields)
    result = tool_result_content(part)
    assert (result.text, result.is_error) == (text, is_error)


def test_request_settings_override_model_settings() -> None:
    request = ModelRequest(
        messages=(ContextMessage(role=MessageRole.USER, parts=(TextPart(text="hi"),)),),
        settings={"temperature": 0.9, "seed": 7, "repetition_penalty": 1.1},
    )
    openai = OpenAICompatModel("m", temperature=0.1, include_usage=False)
    kwargs = openai.request_kwargs(request)
    assert kwargs["temperature"] == 0.9
    assert kwargs["seed"] == 7
    assert kwargs["extra_body"] == {"repetition_penalty": 1.1}
    assert "stream_options" not in kwargs
    assert "tools" not in kwargs
    claude = AnthropicModel("c", max_tokens=50).request_kwargs(request)
    assert claude["max_tokens"] == 50
    assert "system" not in claude
    # Which settings create() takes as keywords depends on the SDK's version (temperature
    # left its signature): the rest travel in the body.
    settings = dict(request.settings)
    known = {k: v for k, v in settings.items() if k in anthropic_create_params}
    assert {k: claude[k] for k in known} == known
    assert claude["extra_body"] == {k: v for k, v in settings.items() if k not in known}
