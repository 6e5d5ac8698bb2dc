"""StepAssembler: text, tool calls by index, usage and finish reason from normalised deltas."""

from __future__ import annotations

import json

from runtime.providers.model_api import (
    FinishDelta,
    ModelDeltaAdapter,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from runtime.providers.parts import (
    FinishReceived,
    StepAssembler,
    TextAppended,
    ToolCallArgumentsAppended,
    ToolCallStarted,
    Usage,
    UsageUpdated,
    parse_tool_arguments,
)


def test_text_accumulates_and_is_reported_per_delta() -> None:
    asm = StepAssembler()
    assert asm.feed(TextDelta(text="Hel")) == [TextAppended("Hel")]
    assert asm.feed(TextDelta(text="")) == []
    assert asm.feed(TextDelta(text="lo")) == [TextAppended("lo")]
    step = asm.result()
    assert step.text == "Hello"
    assert step.tool_calls == []
    assert step.finish_reason is None
    assert step.usage == Usage(0, 0)


def test_tool_call_arguments_split_across_fragments_are_parsed_at_the_end() -> None:
    asm = StepAssembler()
    events = asm.feed_all(
        [
            ToolCallDelta(index=0, id="call_1", name="get_weather", arguments='{"ci'),
            ToolCallDelta(index=0, arguments='ty": "Pa'),
            ToolCallDelta(index=0, arguments='ris"}'),
            FinishDelta(reason="tool_calls"),
        ]
    )
    assert events[:2] == [
        ToolCallStarted(0, "call_1", "get_weather"),
        ToolCallArgumentsAppended(0, '{"ci'),
    ]
    assert events[-1] == FinishReceived("tool_calls")
    [call] = asm.result().tool_calls
    assert (call.id, call.name, call.input, call.error) == (
        "call_1",
        "get_weather",
        {"city": "Paris"},
        None,
    )
    assert call.ok
    assert call.raw_arguments == '{"city": "Paris"}'
    assert asm.result().finish_reason == "tool_calls"


def test_interleaved_calls_are_kept_apart_and_ordered_by_index() -> None:
    asm = StepAssembler()
    asm.feed_all(
        [
            ToolCallDelta(index=1, id="b", name="second", arguments='{"n":'),
            ToolCallDelta(index=0, id="a", name="first", arguments='{"n":'),
            ToolCallDelta(index=1, arguments=" 2}"),
            ToolCallDelta(index=0, arguments=" 1}"),
        ]
    )
    calls = asm.result().tool_calls
    assert [(c.id, c.name, c.input) for c in calls] == [
        ("a", "first", {"n": 1}),
        ("b", "second", {"n": 2}),
    ]


def test_repeated_id_and_name_are_not_concatenated() -> None:
    asm = StepAssembler()
    asm.feed(ToolCallDelta(index=0, id="call_9", name="lookup", arguments="{"))
    events = asm.feed(ToolCallDelta(index=0, id="call_9", name="lookup", arguments="}"))
    assert events == [ToolCallArgumentsAppended(0, "}")]
    [call] = asm.result().tool_calls
    assert (call.id, call.name, call.input) == ("call_9", "lookup", {})


def test_id_arriving_on_a_later_fragment_is_used() -> None:
    asm = StepAssembler()
    asm.feed(ToolCallDelta(index=0, name="lookup"))
    asm.feed(ToolCallDelta(index=0, id="late", arguments="{}"))
    assert asm.result().tool_calls[0].id == "late"


def test_missing_ids_are_generated_unique_and_stable() -> None:
    asm = StepAssembler()
    asm.feed(ToolCallDelta(index=0, name="a", arguments="{}"))
    asm.feed(ToolCallDelta(index=1, name="b", arguments="{}"))
    first = [c.id for c in asm.result().tool_calls]
    second = [c.id for c in asm.result().tool_calls]
    assert first == second
    assert len(set(first)) == 2
    assert all(i.startswith("call_") and len(i) > 10 for i in first)


def test_invalid_json_is_recorded_on_that_call_without_crashing() -> None:
    asm = StepAssembler()
    asm.feed_all(
        [
            ToolCallDelta(index=0, id="bad", name="get_weather", arguments='{"city": "Par'),
            ToolCallDelta(index=1, id="good", name="get_weather", arguments='{"city": "Rome"}'),
        ]
    )
    bad, good = asm.result().tool_calls
    assert bad.input == {}
    assert not bad.ok
    assert bad.error is not None
    assert "invalid JSON arguments for tool 'get_weather'" in bad.error
    assert bad.raw_arguments == '{"city": "Par'
    assert good.ok
    assert good.input == {"city": "Rome"}


def test_arguments_must_be_an_object() -> None:
    assert parse_tool_arguments("t", "[1, 2]") == (
        {},
        "arguments for tool 't' must be a JSON object, got array",
    )
    assert parse_tool_arguments("t", '"x"')[1] is not None
    assert parse_tool_arguments("t", "null")[1] is not None


def test_empty_arguments_mean_no_input() -> None:
    asm = StepAssembler()
    asm.feed(ToolCallDelta(index=0, id="x", name="ping"))
    assert asm.result().tool_calls[0].input == {}
    assert asm.result().tool_calls[0].ok
    assert parse_tool_arguments("ping", "  ") == ({}, None)


def test_call_without_a_name_is_an_error() -> None:
    asm = StepAssembler()
    asm.feed(ToolCallDelta(index=0, id="x", arguments="{}"))
    [call] = asm.result().tool_calls
    assert call.name == ""
    assert call.error == "tool call has no name"


def test_usage_is_summed_and_the_last_finish_reason_wins() -> None:
    asm = StepAssembler()
    assert asm.feed(UsageDelta(input_tokens=10, output_tokens=1)) == [UsageUpdated(10, 1)]
    asm.feed(FinishDelta(reason="stop"))
    assert asm.feed(UsageDelta(output_tokens=4)) == [UsageUpdated(10, 5)]
    asm.feed(FinishDelta(reason="length"))
    step = asm.result()
    assert step.usage == Usage(10, 5)
    assert step.finish_reason == "length"


def test_text_and_tool_calls_in_one_step() -> None:
    wire = [
        {"type": "text", "text": "Let me check. "},
        {"type": "tool-call", "index": 0, "id": "c1", "name": "get_weather"},
        {"type": "tool-call", "index": 0, "arguments": json.dumps({"city": "Oslo"})},
        {"type": "usage", "input_tokens": 3, "output_tokens": 7},
        {"type": "finish", "reason": "tool_calls"},
    ]
    asm = StepAssembler()
    for item in wire:
        asm.feed(ModelDeltaAdapter.validate_python(item))
    step = asm.result()
    assert step.text == "Let me check. "
    assert [(c.id, c.input) for c in step.tool_calls] == [("c1", {"city": "Oslo"})]
    assert step.usage == Usage(3, 7)
