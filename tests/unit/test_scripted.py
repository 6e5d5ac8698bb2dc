"""ScriptedModel and FunctionModel: recorded calls, scripted failures, response builders."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runtime.domain import MessageRole, TextPart
from runtime.providers.model_api import (
    ContextMessage,
    FinishDelta,
    ModelDelta,
    ModelRequest,
    ProviderError,
    TextDelta,
    UsageDelta,
)
from runtime.providers.parts import StepAssembler
from runtime.providers.scripted import (
    FunctionModel,
    ScriptedModel,
    ScriptedToolCall,
    fail_mid_stream,
    split_text,
    text_response,
    tool_call_response,
    tool_calls_response,
)


def request(text: str = "hi") -> ModelRequest:
    return ModelRequest(
        messages=(ContextMessage(role=MessageRole.USER, parts=(TextPart(text=text),)),)
    )


async def collect(stream: AsyncIterator[ModelDelta]) -> list[ModelDelta]:
    return [delta async for delta in stream]


async def test_text_response_streams_in_chunks_and_records_calls() -> None:
    model = ScriptedModel([text_response("hello world", chunks=3)])
    deltas = await collect(model.stream(request("first")))
    texts = [d.text for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) == 3
    assert "".join(texts) == "hello world"
    assert isinstance(deltas[-2], UsageDelta)
    assert deltas[-1] == FinishDelta(reason="stop")
    assert model.calls == [request("first")]
    assert model.last_request() == request("first")
    model.assert_consumed()


async def test_an_unexpected_extra_call_fails_and_is_remembered() -> None:
    model = ScriptedModel([text_response("one")])
    await collect(model.stream(request()))
    with pytest.raises(AssertionError, match="unexpected model call #2"):
        model.stream(request())
    # Even if the runtime swallowed the AssertionError, the test still fails here.
    with pytest.raises(AssertionError, match="unexpected"):
        model.assert_consumed()


async def test_assert_consumed_fails_when_responses_remain() -> None:
    model = ScriptedModel([text_response("one"), text_response("two")])
    await collect(model.stream(request()))
    assert model.remaining == 1
    with pytest.raises(AssertionError, match="1 scripted response"):
        model.assert_consumed()


async def test_a_scripted_exception_surfaces_at_the_first_iteration() -> None:
    model = ScriptedModel([ProviderError("down", retryable=True, status=503)])
    stream = model.stream(request())  # creating the stream does not fail yet
    with pytest.raises(ProviderError) as info:
        await stream.__anext__()
    assert info.value.retryable
    assert info.value.status == 503
    model.assert_consumed()


async def test_fail_mid_stream_yields_deltas_then_raises() -> None:
    model = ScriptedModel([fail_mid_stream([TextDelta(text="par"), TextDelta(text="tial")])])
    seen: list[ModelDelta] = []
    with pytest.raises(ProviderError, match="mid-stream"):
        async for delta in model.stream(request()):
            seen.append(delta)
    assert seen == [TextDelta(text="par"), TextDelta(text="tial")]


async def test_fail_mid_stream_with_a_custom_error() -> None:
    model = ScriptedModel([fail_mid_stream([], RuntimeError("boom"))])
    with pytest.raises(RuntimeError, match="boom"):
        await collect(model.stream(request()))


async def test_a_callable_response_sees_the_request() -> None:
    def reply(req: ModelRequest) -> list[ModelDelta]:
        text = req.messages[-1].parts[0]
        assert isinstance(text, TextPart)
        return text_response(text.text.upper())

    model = ScriptedModel([reply])
    deltas = await collect(model.stream(request("shout")))
    assert deltas[0] == TextDelta(text="SHOUT")


async def test_tool_call_response_assembles_into_the_input() -> None:
    model = ScriptedModel(
        [tool_call_response("get_weather", {"city": "Paris"}, id="call_1", fragments=4)]
    )
    asm = StepAssembler()
    deltas = await collect(model.stream(request()))
    assert sum(1 for d in deltas if d.type == "tool-call") == 4
    asm.feed_all(deltas)
    step = asm.result()
    assert step.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.input) for c in step.tool_calls] == [
        ("call_1", "get_weather", {"city": "Paris"})
    ]


async def test_tool_calls_response_with_text_and_several_calls() -> None:
    deltas = tool_calls_response(
        ScriptedToolCall("a", {"x": 1}, "id_a"),
        ScriptedToolCall("b", {"y": [1, 2]}),
        text="Working on it.",
    )
    asm = StepAssembler()
    asm.feed_all(deltas)
    step = asm.result()
    assert step.text == "Working on it."
    assert [(c.name, c.input) for c in step.tool_calls] == [("a", {"x": 1}), ("b", {"y": [1, 2]})]
    assert step.tool_calls[0].id == "id_a"
    assert step.tool_calls[1].id.startswith("call_")


async def test_function_model_with_an_async_generator() -> None:
    async def fn(req: ModelRequest) -> AsyncIterator[ModelDelta]:
        yield TextDelta(text=str(len(req.messages)))
        yield FinishDelta(reason="stop")

    model = FunctionModel(fn)
    assert await collect(model.stream(request())) == [
        TextDelta(text="1"),
        FinishDelta(reason="stop"),
    ]
    assert model.calls == [request()]


async def test_function_model_with_a_list_or_an_awaitable_list() -> None:
    def plain(req: ModelRequest) -> list[ModelDelta]:
        return text_response("plain")

    async def awaited(req: ModelRequest) -> list[ModelDelta]:
        return text_response("awaited")

    assert (await collect(FunctionModel(plain).stream(request())))[0] == TextDelta(text="plain")
    assert (await collect(FunctionModel(awaited).stream(request())))[0] == TextDelta(text="awaited")


def test_split_text() -> None:
    assert split_text("abcdefg", 3) == ["abc", "de", "fg"]
    assert split_text("ab", 5) == ["a", "b"]
    assert split_text("", 3) == []
    assert split_text("abc", 0) == ["abc"]
