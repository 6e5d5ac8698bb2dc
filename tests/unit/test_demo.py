"""The demo agent: model decisions from context, streaming shape, tools, and its redaction."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runtime.demo import (
    INSTRUCTIONS,
    DemoModel,
    EmailApproval,
    RedactEmails,
    demo_agent,
    get_weather,
    send_email,
)
from runtime.demo.demo_model import (
    DEFAULT_DELAY_MS,
    MAX_CHUNKS,
    TextPlan,
    ToolCallPlan,
    decide,
    delay_seconds,
    echo,
    split_chunks,
)
from runtime.demo.demo_tools import fake_weather
from runtime.demo.redact import EMAIL, REDACTED
from runtime.domain import (
    MAX_TEXT_CHARS,
    MessageRole,
    Part,
    Role,
    RunTrigger,
    TextPart,
    ToolCallPart,
    ToolState,
)
from runtime.lifecycle import RunContext, StepContext
from runtime.providers.model_api import (
    ContextMessage,
    FinishDelta,
    ModelDelta,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from runtime.providers.parts import AssembledStep, StepAssembler
from runtime.tools import Tool, ToolContext
from threadline_wire.chunks import StreamChunk, TextDeltaChunk

AGENT = demo_agent()
TOOLS = tuple(t.spec for t in AGENT.tools)


def user(text: str) -> ContextMessage:
    return ContextMessage(role=MessageRole.USER, parts=(TextPart(text=text),))


def assistant(*parts: Part) -> ContextMessage:
    return ContextMessage(role=MessageRole.ASSISTANT, parts=parts)


def req(*messages: ContextMessage, tools: tuple[Any, ...] = TOOLS) -> ModelRequest:
    return ModelRequest(instructions=INSTRUCTIONS, messages=messages, tools=tools)


def tool_part(name: str, input: dict[str, Any], state: ToolState, **fields: Any) -> ToolCallPart:
    return ToolCallPart(tool_call_id="call_1", name=name, input=input, state=state, **fields)


async def run_model(request: ModelRequest, model: DemoModel | None = None) -> list[ModelDelta]:
    return [d async for d in (model or DemoModel(delay_ms=0)).stream(request)]


async def assemble(request: ModelRequest) -> AssembledStep:
    asm = StepAssembler()
    asm.feed_all(await run_model(request))
    return asm.result()


# --- decisions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "city"),
    [
        ("What's the weather in Paris?", "Paris"),
        ("weather in New York, please", "New York"),
        ("Tell me the Weather in  Lyon", "Lyon"),
        ("weather in São Paulo!", "São Paulo"),
    ],
)
def test_weather_request_calls_get_weather(text: str, city: str) -> None:
    assert decide(req(user(text))) == ToolCallPlan("get_weather", {"city": city})


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("Please email bob@example.com about lunch", "bob@example.com"),
        ("Email to alice.smith+news@mail.example.org.", "alice.smith+news@mail.example.org"),
        ("email: x_y@host.io", "x_y@host.io"),
    ],
)
def test_email_request_calls_send_email(text: str, address: str) -> None:
    assert decide(req(user(text))) == ToolCallPlan("send_email", {"to": address, "body": text})


@pytest.mark.parametrize(
    "text",
    ["hello there", "weather is nice", "my email is bob@example.com", "weather in 42", ""],
)
def test_anything_else_is_echoed(text: str) -> None:
    expected = f"You said: {text}" if text else "You said nothing."
    assert decide(req(user(text))) == TextPlan(expected)


def test_a_tool_the_request_does_not_offer_is_never_called() -> None:
    assert decide(req(user("weather in Paris"), tools=())) == TextPlan("You said: weather in Paris")


def test_weather_result_is_answered() -> None:
    part = tool_part(
        "get_weather",
        {"city": "Paris"},
        ToolState.OUTPUT_AVAILABLE,
        output={"city": "Paris", "conditions": "sunny", "temperature_c": 21},
    )
    plan = decide(req(user("weather in Paris"), assistant(part)))
    assert plan == TextPlan("The weather in Paris is sunny, 21°C.")


def test_weather_failure_is_answered() -> None:
    part = tool_part("get_weather", {"city": "Paris"}, ToolState.OUTPUT_ERROR, error="timeout")
    plan = decide(req(user("weather in Paris"), assistant(part)))
    assert plan == TextPlan("I could not get the weather for Paris: timeout.")


def test_sent_email_is_confirmed_with_the_address() -> None:
    part = tool_part(
        "send_email",
        {"to": "bob@example.com", "body": "hi"},
        ToolState.OUTPUT_AVAILABLE,
        output={"sent": True, "to": "bob@example.com"},
    )
    plan = decide(req(user("email bob@example.com"), assistant(part)))
    assert plan == TextPlan("Done: I sent the email to bob@example.com.")


@pytest.mark.parametrize(
    ("state", "fields", "answer"),
    [
        (
            ToolState.OUTPUT_AVAILABLE,
            {"output": {"sent": False, "reason": "refused"}},
            "I did not send the email.",
        ),
        (
            ToolState.OUTPUT_AVAILABLE,
            {"output": {"sent": False, "reason": "refused", "note": "not now"}},
            "I did not send the email. Note: not now",
        ),
        (ToolState.REJECTED, {"error": "blocked"}, "I did not send the email."),
        (ToolState.REJECTED, {"error": "denied"}, "I did not send the email."),
        (
            ToolState.REJECTED,
            {"error": "denied: not now"},
            "I did not send the email. Note: not now",
        ),
        (ToolState.CANCELLED, {"error": "run stopped"}, "I did not send the email."),
    ],
)
def test_unsent_email_is_reported(state: ToolState, fields: dict[str, Any], answer: str) -> None:
    part = tool_part("send_email", {"to": "bob@example.com"}, state, **fields)
    assert decide(req(user("email bob@example.com"), assistant(part))) == TextPlan(answer)


def test_tool_results_already_answered_or_not_final_fall_back_to_echo() -> None:
    done = tool_part(
        "get_weather",
        {"city": "Oslo"},
        ToolState.OUTPUT_AVAILABLE,
        output=fake_weather("Oslo"),
    )
    answered = assistant(done, TextPart(text="The weather in Oslo is ..."))
    assert decide(req(user("weather in Oslo"), answered)) == TextPlan("You said: weather in Oslo")
    waiting = tool_part("send_email", {"to": "a@b.io"}, ToolState.AWAITING_ACTION)
    assert decide(req(user("email a@b.io"), assistant(waiting))) == TextPlan(
        "You said: email a@b.io"
    )


def test_system_messages_are_ignored_when_finding_the_last_message() -> None:
    system = ContextMessage(role=MessageRole.SYSTEM, parts=(TextPart(text="be brief"),))
    assert decide(req(user("weather in Rome"), system)) == ToolCallPlan(
        "get_weather", {"city": "Rome"}
    )


# --- streaming -----------------------------------------------------------------------------------


async def test_text_streams_in_several_small_chunks_then_usage_and_finish() -> None:
    deltas = await run_model(req(user("hello there, how are you?")))
    texts = [d.text for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) > 3
    assert all(1 <= len(t) <= 5 for t in texts)
    assert "".join(texts) == "You said: hello there, how are you?"
    usage, finish = deltas[-2:]
    assert isinstance(usage, UsageDelta)
    assert usage.output_tokens == 7
    assert usage.input_tokens > 0
    assert finish == FinishDelta(reason="stop")


def test_input_tokens_count_every_message_of_a_growing_conversation() -> None:
    from runtime.demo.demo_model import _context_words, _words

    history = [user("one two"), assistant(TextPart(text="three")), user("four five six")]
    system = ContextMessage(role=MessageRole.SYSTEM, parts=(TextPart(text="sys tem words"),))
    base = _words(INSTRUCTIONS)
    assert _context_words(req(*history)) == base + 6
    # The same message objects and more: the earlier total is reused, the new ones added.
    assert _context_words(req(*history, user("seven"))) == base + 7
    assert _context_words(req(*history, system, user("eight nine"))) == base + 11
    # The last message re-read as a new object (a thread's tail): counted again, as it is now.
    tail = user("four five six seven")
    assert _context_words(req(*history)) == base + 6
    assert _context_words(req(*history[:2], tail)) == base + 7
    assert _context_words(req(*history[:2], tail, user("x y"))) == base + 9
    # A shorter request, or one whose earlier messages are other objects, counts from scratch.
    assert _context_words(req(*history[:2])) == base + 3
    assert _context_words(req(history[0], user("x"), *history[2:])) == base + 6
    assert _context_words(req()) == base


async def test_an_echoed_address_is_split_across_chunks() -> None:
    text = "my address is carol.jones@example.com ok"
    texts = [d.text for d in await run_model(req(user(text))) if isinstance(d, TextDelta)]
    assert "carol.jones@example.com" in "".join(texts)
    assert not any(EMAIL.search(t) for t in texts)


def test_long_replies_take_a_bounded_number_of_chunks_and_fit_a_text_part() -> None:
    assert split_chunks("x" * 1_000) == ["x" * 5] * 200
    long = echo("y" * (MAX_TEXT_CHARS + 10))
    assert len(long) == MAX_TEXT_CHARS
    chunks = split_chunks(long)
    assert len(chunks) <= MAX_CHUNKS
    assert "".join(chunks) == long


async def test_tool_call_is_streamed_in_fragments_and_assembles() -> None:
    deltas = await run_model(req(user("weather in Paris")))
    fragments = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert len(fragments) == 2
    assert fragments[0].id is not None
    assert fragments[0].name == "get_weather"
    step = await assemble(req(user("weather in Paris")))
    assert step.text == ""
    assert step.finish_reason == "tool_calls"
    [call] = step.tool_calls
    assert (call.name, call.input, call.error) == ("get_weather", {"city": "Paris"}, None)


async def test_each_tool_call_gets_a_fresh_id() -> None:
    first = await assemble(req(user("weather in Paris")))
    second = await assemble(req(user("weather in Paris")))
    assert first.tool_calls[0].id != second.tool_calls[0].id


def test_delay_comes_from_the_environment_at_stream_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("THREADLINE_DEMO_DELAY_MS", raising=False)
    assert delay_seconds() == DEFAULT_DELAY_MS / 1000
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "0")
    assert delay_seconds() == 0
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "12.5")
    assert delay_seconds() == 0.0125
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "soon")
    assert delay_seconds() == DEFAULT_DELAY_MS / 1000


async def test_the_delay_is_applied_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    model = DemoModel()  # no override: the environment decides, when streaming starts
    request = req(user("abcdefghij"))  # "You said: abcdefghij" -> 4 chunks, 3 pauses
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "40")
    started = time.monotonic()
    deltas = await run_model(request, model)
    assert sum(isinstance(d, TextDelta) for d in deltas) == 4
    assert time.monotonic() - started >= 0.12
    monkeypatch.setenv("THREADLINE_DEMO_DELAY_MS", "0")
    started = time.monotonic()
    await run_model(request, model)
    assert time.monotonic() - started < 0.1


# --- tools ---------------------------------------------------------------------------------------


def tool_context(payload: EmailApproval | None) -> ToolContext:
    return ToolContext(tool_call_id="call_1", run_id="r", thread_id="t", payload=payload)


async def call_tool(tool: Tool, raw: dict[str, Any], payload: EmailApproval | None = None) -> Any:
    return await tool.execute(tool.validate_input(raw), tool_context(payload))


async def test_get_weather_is_deterministic_per_city() -> None:
    paris = await call_tool(get_weather, {"city": "Paris"})
    assert paris == await call_tool(get_weather, {"city": " paris "}) | {"city": "Paris"}
    assert set(paris) == {"city", "conditions", "temperature_c"}
    assert isinstance(paris["temperature_c"], int)
    results = {str(fake_weather(c)) for c in ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo"]}
    assert len(results) > 1


async def test_send_email_respects_the_approval() -> None:
    raw = {"to": "bob@example.com", "body": "hi"}
    assert await call_tool(send_email, raw, EmailApproval(approved=True)) == {
        "sent": True,
        "to": "bob@example.com",
    }
    assert await call_tool(send_email, raw, EmailApproval(approved=False, note="no")) == {
        "sent": False,
        "to": "bob@example.com",
        "reason": "refused",
        "note": "no",
    }
    assert (await call_tool(send_email, raw, None))["sent"] is False


def test_send_email_suspends_for_a_typed_approval() -> None:
    suspend = send_email.suspend
    assert suspend is not None
    assert set(suspend.allowed_roles) == {Role.USER, Role.BACKEND, Role.ADMIN}
    schema = suspend.payload.model_json_schema()
    assert schema["required"] == ["approved"]
    assert schema["properties"]["approved"]["type"] == "boolean"
    assert "note" in schema["properties"]
    assert get_weather.suspend is None


def test_demo_agent_wiring() -> None:
    agent = demo_agent()
    assert [t.name for t in agent.tools] == ["get_weather", "send_email"]
    assert isinstance(agent.model, DemoModel)
    assert isinstance(agent.lifecycle, RedactEmails)
    assert agent.instructions


# --- a whole demo conversation through model, tools and redaction -------------------------------


def step_context() -> StepContext:
    run = RunContext(
        thread_id="t",
        scope="demo",
        run_id="r",
        episode=1,
        started_by="u",
        trigger=RunTrigger.MESSAGE,
        resumed=False,
        state={},
        thread_metadata={},
    )
    return StepContext(run=run, step=1, local={})


async def canonical_text(request: ModelRequest) -> tuple[list[str], str]:
    """Stream a step through the demo lifecycle like the runtime does; the canonical texts."""

    async def chunks() -> AsyncIterator[StreamChunk]:
        async for delta in DemoModel(delay_ms=0).stream(request):
            if isinstance(delta, TextDelta):
                yield TextDeltaChunk(delta=delta.text)

    out = [
        c.delta
        async for c in RedactEmails().transform_step_stream(step_context(), chunks())
        if isinstance(c, TextDeltaChunk)
    ]
    return out, "".join(out)


async def test_approved_email_conversation_never_shows_the_address_in_assistant_text() -> None:
    question = user("Please email dora@example.com about the meeting")
    step = await assemble(req(question))
    [call] = step.tool_calls
    output = await call_tool(send_email, call.input, EmailApproval(approved=True))
    part = ToolCallPart(
        tool_call_id=call.id,
        name=call.name,
        input=call.input,
        state=ToolState.OUTPUT_AVAILABLE,
        output=output,
    )
    pieces, text = await canonical_text(req(question, assistant(part)))
    assert text == f"Done: I sent the email to {REDACTED}."
    assert not any("@" in piece or "dora" in piece for piece in pieces)


async def test_weather_conversation() -> None:
    question = user("What's the weather in Paris?")
    [call] = (await assemble(req(question))).tool_calls
    output = await call_tool(get_weather, call.input)
    part = ToolCallPart(
        tool_call_id=call.id,
        name=call.name,
        input=call.input,
        state=ToolState.OUTPUT_AVAILABLE,
        output=output,
    )
    _, text = await canonical_text(req(question, assistant(part)))
    assert text == (f"The weather in Paris is {output['conditions']}, {output['temperature_c']}°C.")


async def test_echo_of_an_address_is_redacted() -> None:
    pieces, text = await canonical_text(req(user("write to eve@corp.example.net, thanks")))
    assert text == f"You said: write to {REDACTED}, thanks"
    assert not any("eve" in piece for piece in pieces)
