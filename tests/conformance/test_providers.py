"""Real providers (official SDKs) against a local server speaking their streaming wire format."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from runtime.domain import MessageRole, TextPart, ToolCallPart, ToolState
from runtime.instruments import PROVIDER_FAILURES
from runtime.providers.model_api import (
    ContextMessage,
    ModelDelta,
    ModelRequest,
    ProviderError,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)
from runtime.providers.openai_compat import OpenAICompatModel
from runtime.providers.parts import AssembledStep, StepAssembler, Usage
from tests.conformance.provider_wire import (
    AnthropicVendor,
    OpenAIVendor,
    Vendor,
    WireServer,
    closed_port,
)


@pytest.fixture(scope="module")
def wire_server() -> Iterator[WireServer]:
    server = WireServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server(wire_server: WireServer) -> Iterator[WireServer]:
    wire_server.reset()
    yield wire_server
    wire_server.reset()


@pytest.fixture(params=[OpenAIVendor(), AnthropicVendor()], ids=lambda v: v.name)
def vendor(request: pytest.FixtureRequest) -> Vendor:
    vendor: Vendor = request.param
    return vendor


@pytest.fixture
async def model(vendor: Vendor, server: WireServer) -> AsyncIterator[Any]:
    async with vendor.model(server.url) as opened:
        yield opened


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The telemetry attributes of every counted provider failure."""
    seen: list[dict[str, Any]] = []

    def record(counter: Any, amount: float, attributes: dict[str, Any] | None = None) -> None:
        assert counter is PROVIDER_FAILURES
        seen.append(dict(attributes or {}))

    monkeypatch.setattr("runtime.providers.failures.safe_add", record)
    return seen


def ask(text: str = "hello") -> ModelRequest:
    return ModelRequest(
        instructions="Be brief.",
        messages=(ContextMessage(role=MessageRole.USER, parts=(TextPart(text=text),)),),
    )


async def consume(stream: AsyncIterator[ModelDelta]) -> tuple[list[ModelDelta], Exception | None]:
    deltas: list[ModelDelta] = []
    try:
        async for delta in stream:
            deltas.append(delta)
    except Exception as exc:
        return deltas, exc
    return deltas, None


def assemble(deltas: list[ModelDelta]) -> AssembledStep:
    asm = StepAssembler()
    asm.feed_all(deltas)
    return asm.result()


# --- streaming ------------------------------------------------------------------------------------


async def test_text_arrives_in_several_deltas_with_usage_and_finish(
    vendor: Vendor, server: WireServer, model: Any
) -> None:
    server.reply(vendor.text_reply(["Hel", "lo, ", "wor", "ld"], usage=(12, 5)))
    deltas, error = await consume(model.stream(ask()))
    assert error is None
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["Hel", "lo, ", "wor", "ld"]
    step = assemble(deltas)
    assert step.text == "Hello, world"
    assert step.usage == Usage(12, 5)
    assert step.finish_reason == "stop"
    assert step.tool_calls == []


async def test_tool_call_arguments_split_across_chunks_are_assembled(
    vendor: Vendor, server: WireServer, model: Any
) -> None:
    server.reply(
        vendor.tool_reply(
            [("call_w1", "get_weather", ['{"ci', 'ty": "Pa', 'ris", "days"', ": 2}"])],
            text=["Let me ", "check."],
        )
    )
    deltas, error = await consume(model.stream(ask("weather in Paris")))
    assert error is None
    assert sum(1 for d in deltas if isinstance(d, ToolCallDelta) and d.arguments) == 4
    step = assemble(deltas)
    assert step.text == "Let me check."
    assert step.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.input, c.error) for c in step.tool_calls] == [
        ("call_w1", "get_weather", {"city": "Paris", "days": 2}, None)
    ]


async def test_several_tool_calls_stay_apart(
    vendor: Vendor, server: WireServer, model: Any
) -> None:
    server.reply(
        vendor.tool_reply(
            [("c_a", "first", ['{"n"', ": 1}"]), ("c_b", "second", ["{}"])],
        )
    )
    deltas, _ = await consume(model.stream(ask()))
    step = assemble(deltas)
    assert [(c.id, c.name, c.input) for c in step.tool_calls] == [
        ("c_a", "first", {"n": 1}),
        ("c_b", "second", {}),
    ]


async def test_closing_the_stream_early_releases_the_connection(
    vendor: Vendor, server: WireServer, model: Any
) -> None:
    server.reply(vendor.text_reply(["a", "b", "c"], (1, 1)), vendor.text_reply(["ok"], (1, 1)))
    stream = model.stream(ask())
    first = await stream.__anext__()
    while not isinstance(first, TextDelta):  # Anthropic reports usage first
        first = await stream.__anext__()
    assert first == TextDelta(text="a")
    await stream.aclose()
    deltas, error = await consume(model.stream(ask()))
    assert error is None
    assert assemble(deltas).text == "ok"


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (429, True), (529, True), (400, False), (401, False)]
)
async def test_http_error_status_surfaces_at_the_first_iteration(
    vendor: Vendor,
    server: WireServer,
    model: Any,
    failures: list[dict[str, Any]],
    status: int,
    retryable: bool,
) -> None:
    server.reply(vendor.status_reply(status))
    stream = model.stream(ask())
    # Creating the stream sends nothing: the runtime primes it inside around_model_call.
    assert server.received == []
    with pytest.raises(ProviderError) as info:
        await stream.__anext__()
    assert info.value.status == status
    assert info.value.retryable is retryable
    assert len(server.received) == 1  # max_retries=0: one attempt
    assert failures == [
        {"provider": vendor.name, "phase": "setup", "retryable": retryable, "status": status}
    ]


async def test_connection_refused_is_a_retryable_setup_failure(
    vendor: Vendor, failures: list[dict[str, Any]]
) -> None:
    async with vendor.model(f"http://127.0.0.1:{closed_port()}") as model:
        stream = model.stream(ask())
        with pytest.raises(ProviderError) as info:
            await stream.__anext__()
    assert info.value.retryable
    assert info.value.status is None
    assert [f["phase"] for f in failures] == ["setup"]


async def test_error_event_mid_stream_comes_after_the_earlier_deltas(
    vendor: Vendor, server: WireServer, model: Any, failures: list[dict[str, Any]]
) -> None:
    server.reply(vendor.error_mid_stream(["par", "tial"]))
    deltas, error = await consume(model.stream(ask()))
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["par", "tial"]
    assert isinstance(error, ProviderError)
    assert error.retryable
    assert [(f["phase"], f["retryable"]) for f in failures] == [("stream", True)]


async def test_connection_dropped_mid_stream_comes_after_the_earlier_deltas(
    vendor: Vendor, server: WireServer, model: Any, failures: list[dict[str, Any]]
) -> None:
    server.reply(vendor.dropped_mid_stream(["one ", "two"]))
    deltas, error = await consume(model.stream(ask()))
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["one ", "two"]
    assert isinstance(error, ProviderError)
    assert error.retryable
    assert [f["phase"] for f in failures] == ["stream"]


# --- what the server receives ---------------------------------------------------------------------

WEATHER_TOOL = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def conversation() -> ModelRequest:
    """Two steps in one assistant message, with tool parts in several final and open states."""
    tail = (
        TextPart(text="Checking."),
        ToolCallPart(
            tool_call_id="c1",
            name="get_weather",
            input={"city": "Paris"},
            state=ToolState.OUTPUT_AVAILABLE,
            output={"temp": 21},
        ),
        ToolCallPart(
            tool_call_id="c2",
            name="send_email",
            input={"to": "x"},
            state=ToolState.CANCELLED,
            error="run stopped",
        ),
        TextPart(text="Paris is 21°C."),
        ToolCallPart(
            tool_call_id="c3", name="lookup", input={}, state=ToolState.OUTPUT_ERROR, error="boom"
        ),
        ToolCallPart(
            tool_call_id="c4", name="send_email", input={"to": "y"}, state=ToolState.AWAITING_ACTION
        ),
    )
    return ModelRequest(
        instructions="Be helpful.",
        messages=(
            ContextMessage(role=MessageRole.USER, parts=(TextPart(text="Weather in Paris?"),)),
            ContextMessage(role=MessageRole.ASSISTANT, parts=tail),
            ContextMessage(role=MessageRole.USER, parts=(TextPart(text="thanks"),)),
        ),
        tools=(WEATHER_TOOL,),
        settings={"temperature": 0.2, "top_k": 5},
    )


def _openai_call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


async def test_openai_request_on_the_wire(server: WireServer) -> None:
    vendor = OpenAIVendor()
    server.reply(vendor.text_reply(["ok"], (1, 1)))
    async with vendor.model(server.url) as model:
        await consume(model.stream(conversation()))
    [received] = server.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer sk-test"
    body = received.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.2
    assert body["top_k"] == 5  # unknown to the SDK: passed through in the body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": WEATHER_TOOL.parameters,
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                _openai_call("c1", "get_weather", {"city": "Paris"}),
                _openai_call("c2", "send_email", {"to": "x"}),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": "the tool call was cancelled: run stopped",
        },
        {
            "role": "assistant",
            "content": "Paris is 21°C.",
            "tool_calls": [
                _openai_call("c3", "lookup", {}),
                _openai_call("c4", "send_email", {"to": "y"}),
            ],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "the tool call failed: boom"},
        {
            "role": "tool",
            "tool_call_id": "c4",
            "content": "the tool call is waiting for a human and has no result yet",
        },
        {"role": "user", "content": "thanks"},
    ]


async def test_anthropic_request_on_the_wire(server: WireServer) -> None:
    vendor = AnthropicVendor()
    server.reply(vendor.text_reply(["ok"], (1, 1)))
    async with vendor.model(server.url) as model:
        await consume(model.stream(conversation()))
    [received] = server.received
    assert received.path == "/v1/messages"
    # SDK 2.x sends the API key as a bearer token.
    assert received.headers["authorization"] == "Bearer sk-ant-test"
    assert received.headers["anthropic-version"]
    body = received.body
    assert body["model"] == "claude-test"
    assert body["stream"] is True
    assert body["max_tokens"] == 1024
    assert body["system"] == "Be helpful."
    assert body["temperature"] == 0.2
    assert body["top_k"] == 5
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather for a city.",
            "input_schema": WEATHER_TOOL.parameters,
        }
    ]

    def use(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": args}

    def result(call_id: str, content: str, is_error: bool) -> dict[str, Any]:
        return {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": content,
            "is_error": is_error,
        }

    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                use("c1", "get_weather", {"city": "Paris"}),
                use("c2", "send_email", {"to": "x"}),
            ],
        },
        {
            "role": "user",
            "content": [
                result("c1", '{"temp": 21}', False),
                result("c2", "the tool call was cancelled: run stopped", True),
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Paris is 21°C."},
                use("c3", "lookup", {}),
                use("c4", "send_email", {"to": "y"}),
            ],
        },
        {
            "role": "user",
            "content": [
                result("c3", "the tool call failed: boom", True),
                result("c4", "the tool call is waiting for a human and has no result yet", False),
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


async def test_openai_without_any_key_fails_setup_without_retry(
    monkeypatch: pytest.MonkeyPatch, failures: list[dict[str, Any]]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with OpenAICompatModel("gpt-test") as model:
        stream = model.stream(ask())
        with pytest.raises(ProviderError) as info:
            await stream.__anext__()
    assert not info.value.retryable
    assert "credentials" in str(info.value).lower()
    assert [f["phase"] for f in failures] == ["setup"]


async def test_openai_compatible_local_server_needs_no_key(
    monkeypatch: pytest.MonkeyPatch, server: WireServer
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.reply(OpenAIVendor().text_reply(["ok"], (1, 1)))
    async with OpenAICompatModel("llama", base_url=f"{server.url}/v1", max_retries=0) as model:
        deltas, error = await consume(model.stream(ask()))
    assert error is None
    assert assemble(deltas).text == "ok"
    assert server.received[0].headers["authorization"] == "Bearer not-needed"
