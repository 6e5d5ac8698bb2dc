"""Example agent: a forecast tool, an alert tool that waits for approval, composed guardrails.

Serve it (from the repository root, so that `examples` is importable):

    PYTHONPATH=. THREADLINE_AGENT=examples.weather_agent:agent .venv/bin/threadline serve

or run it in-process, without a server, to see one conversation end to end:

    .venv/bin/python examples/weather_agent.py

It needs no model key: `weather_model` below is a small deterministic FunctionModel. Set
WEATHER_AGENT_MODEL to use a real model instead (see `build_model`):

    WEATHER_AGENT_MODEL=openai:gpt-4o-mini              OPENAI_API_KEY=...
    WEATHER_AGENT_MODEL=openai:llama3.1  WEATHER_AGENT_BASE_URL=http://127.0.0.1:11434/v1  (Ollama)
    WEATHER_AGENT_MODEL=anthropic:claude-3-5-haiku-latest  ANTHROPIC_API_KEY=...
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime import (
    ALL_ROLES,
    Agent,
    AgentLifecycle,
    BeforeToolDecision,
    FunctionModel,
    MessageRole,
    Model,
    ModelDelta,
    ModelRequest,
    PrepareRunDecision,
    RedactEmails,
    Reject,
    ReplaceInput,
    Respond,
    RunContext,
    Snapshot,
    StepContext,
    SuspendStep,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallContext,
    ToolCallPart,
    ToolContext,
    ToolResult,
    ToolState,
    compose_lifecycle,
    message_text,
    message_turns,
    text_response,
    tool,
    tool_call_response,
)

MAX_DAYS = 7
INSTRUCTIONS = (
    "You are a weather assistant. Use get_forecast for forecasts (at most 7 days) and "
    "subscribe_alerts to set up weather alerts; a person approves every alert first."
)

# --- tools ------------------------------------------------------------------------------------

_CONDITIONS = ("sunny", "partly cloudy", "cloudy", "rainy", "windy", "stormy")


class ForecastInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(min_length=1, max_length=100)
    days: int = Field(default=1, ge=1, le=MAX_DAYS)


def fake_day(city: str, day: int) -> dict[str, Any]:
    """Deterministic weather: the same city and day always get the same forecast."""
    digest = hashlib.sha256(f"{city.strip().casefold()}:{day}".encode()).digest()
    low = digest[0] % 25 - 5
    return {
        "day": day + 1,
        "conditions": _CONDITIONS[digest[1] % len(_CONDITIONS)],
        "low": low,
        "high": low + 3 + digest[2] % 10,
    }


@tool
async def get_forecast(args: ForecastInput) -> dict[str, Any]:
    """Daily forecast for a city, 1 to 7 days, temperatures in degrees Celsius."""
    days = [fake_day(args.city, day) for day in range(args.days)]
    return {"city": args.city.strip(), "units": "metric", "days": days}


AlertKind = Literal["storm", "heat", "frost"]


class AlertInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(min_length=1, max_length=100)
    contact: str = Field(pattern=f"^{RedactEmails.pattern.pattern}$", max_length=254)
    kind: AlertKind


class AlertApproval(BaseModel):
    """Resume payload of `subscribe_alerts`: a person decides, and picks the channel."""

    model_config = ConfigDict(extra="forbid")
    approved: bool
    channel: Literal["email", "sms"] = "email"
    note: str | None = Field(default=None, max_length=500)


# Any role of the thread's scope may approve; pass TRUSTED_ROLES (from runtime) to leave the
# decision to backend actors and admins.
@tool(suspend=SuspendStep(payload=AlertApproval, allowed_roles=ALL_ROLES))
async def subscribe_alerts(args: AlertInput, ctx: ToolContext) -> dict[str, Any]:
    """Subscribe a contact to weather alerts for a city (after a person approves it)."""
    approval = ctx.payload
    if not isinstance(approval, AlertApproval) or not approval.approved:
        note = approval.note if isinstance(approval, AlertApproval) else None
        return {"subscribed": False, "city": args.city, "note": note}
    return {
        "subscribed": True,
        "city": args.city,
        "kind": args.kind,
        "contact": args.contact,
        "channel": approval.channel,
    }


# --- lifecycle: guardrails composed with the demo's e-mail redaction -----------------------------

BLOCKED_CITIES = frozenset({"atlantis", "el dorado"})
CREDENTIALS = re.compile(r"\b(?:passwords?|api[ _-]?keys?|secrets?)\b", re.IGNORECASE)
REFUSAL = "I only talk about the weather, and I never handle credentials."


def _to_fahrenheit(celsius: int) -> int:
    return round(celsius * 9 / 5 + 32)


class WeatherGuardrails:
    """A plain object with some hooks; compose_lifecycle treats the missing ones as no-ops.

    Hooks decide, the runtime applies: nothing here touches storage or the bus.
    """

    async def prepare_run(self, ctx: RunContext) -> PrepareRunDecision:
        # Execution-local context for this episode: thread metadata {"units": "imperial"}
        # switches the forecast to Fahrenheit (see after_tool_result).
        units = ctx.thread_metadata.get("units")
        return PrepareRunDecision(
            context={"units": units if units in ("metric", "imperial") else "metric"}
        )

    async def prepare_model_step(
        self, ctx: StepContext, request: ModelRequest
    ) -> ModelRequest | Respond | None:
        last = request.messages[-1] if request.messages else None
        asks_credentials = (
            last is not None
            and last.role is MessageRole.USER
            and CREDENTIALS.search(message_text(last.parts)) is not None
        )
        if asks_credentials:
            # Committed as the terminal answer; the model is never called.
            return Respond(REFUSAL)
        units = ctx.local.get("units", "metric")
        return request.model_copy(
            update={"instructions": f"{request.instructions} Report temperatures in {units}."}
        )

    async def before_tool_call(
        self, ctx: ToolCallContext, call: ToolCall
    ) -> BeforeToolDecision | None:
        # Runs for every call of the step before any tool starts, and again on resume.
        city = str(call.input.get("city", "")).strip()
        if city.casefold() in BLOCKED_CITIES:
            return Reject(f"{city} is not a place we forecast")
        days = call.input.get("days")
        if call.name == "get_forecast" and isinstance(days, int) and days > MAX_DAYS:
            return ReplaceInput({**call.input, "days": MAX_DAYS})
        return None

    async def after_tool_result(
        self, ctx: ToolCallContext, result: ToolResult
    ) -> ToolResult | None:
        # Normalises the result before it is stored and before the model sees it.
        if ctx.tool_name != "get_forecast" or result.state is not ToolState.OUTPUT_AVAILABLE:
            return None
        if ctx.step.local.get("units") != "imperial" or not isinstance(result.output, dict):
            return None
        days = [
            {**day, "low": _to_fahrenheit(day["low"]), "high": _to_fahrenheit(day["high"])}
            for day in result.output.get("days", [])
        ]
        return ToolResult(result.state, output={**result.output, "units": "imperial", "days": days})


def weather_lifecycle() -> AgentLifecycle:
    """Guardrails first, redaction last: RedactEmails' transform_step_stream is closest to the
    runtime, so what it yields is canonical (published live, stored, seen by the next step)."""
    return compose_lifecycle(WeatherGuardrails(), RedactEmails())


# --- the model --------------------------------------------------------------------------------

FORECAST = re.compile(r"\b(?:weather|forecast)\s+(?:for|in)\s+([^\W\d_][^\n?!.,;:]*)", re.I)
DAYS = re.compile(r"\b(\d{1,2})\s*days?\b", re.IGNORECASE)
ALERT = re.compile(
    r"\balert\s+(" + RedactEmails.pattern.pattern + r")\s+(?:about|of)\s+(storm|heat|frost)s?"
    r"\s+in\s+([^\W\d_][^\n?!.,;:]*)",
    re.IGNORECASE,
)
_CITY_END = re.compile(r"\s+(?:for|over|in|next|during)\b.*$", re.IGNORECASE)


def _city(raw: str) -> str:
    return _CITY_END.sub("", raw).strip()


LOCAL_TIME = re.compile(r"\btime in ([A-Za-z_]+/[A-Za-z_]+|UTC)\b")


def plan(request: ModelRequest) -> list[ModelDelta]:
    """What the example model answers: a tool call for a recognised request, a summary once the
    last step's tool calls have results, otherwise a short help text."""
    messages = [m for m in request.messages if m.role is not MessageRole.SYSTEM]
    last = messages[-1] if messages else None
    if last is not None and last.role is MessageRole.ASSISTANT:
        turns = message_turns(last.parts)
        calls = turns[-1].tool_calls if turns else ()
        if calls and all(call.state.is_final for call in calls):
            return _text(" ".join(summarise(call) for call in calls))
    if last is not None and last.role is MessageRole.USER:
        text = message_text(last.parts)
        alert = ALERT.search(text)
        if alert:
            contact, kind, city = alert.group(1), alert.group(2).lower(), _city(alert.group(3))
            args = {"city": city, "contact": contact, "kind": kind}
            return tool_call_response("subscribe_alerts", args)
        local_time = LOCAL_TIME.search(text)
        offered = {spec.name for spec in request.tools}
        if local_time and "time__get_current_time" in offered:
            # An MCP tool (the reference time server, when the deployment declares it as
            # "time"; examples/README.md): offered like the agent's own tools.
            return tool_call_response("time__get_current_time", {"timezone": local_time.group(1)})
        forecast = FORECAST.search(text)
        if forecast:
            days = DAYS.search(text)
            args = {"city": _city(forecast.group(1)), "days": int(days.group(1)) if days else 1}
            return tool_call_response("get_forecast", args)
    return _text(
        "Ask me for a forecast ('forecast for Lisbon for 3 days') or an alert "
        "('alert ops@example.com about storms in Oslo')."
    )


def summarise(call: ToolCallPart) -> str:
    output = call.output if isinstance(call.output, dict) else {}
    if call.state is not ToolState.OUTPUT_AVAILABLE:
        return f"I could not run {call.name}: {call.error or call.state.value}."
    if call.name == "time__get_current_time":
        return f"In {output.get('timezone')} it is {output.get('datetime')}."
    if call.name == "get_forecast":
        unit = "°F" if output.get("units") == "imperial" else "°C"
        days = "; ".join(
            f"day {d['day']}: {d['conditions']}, {d['low']} to {d['high']}{unit}"
            for d in output.get("days", [])
        )
        return f"Forecast for {output.get('city')}: {days}."
    if call.name == "subscribe_alerts":
        if output.get("subscribed"):
            return (
                f"Done: {output['contact']} will get {output['kind']} alerts for "
                f"{output['city']} by {output['channel']}."
            )
        note = output.get("note")
        return "OK, I did not set up the alert." + (f" Note: {note}" if note else "")
    return f"{call.name} returned {output}."


def _text(text: str) -> list[ModelDelta]:
    # Several small deltas, like a real provider streams them.
    return text_response(text, chunks=max(1, len(text) // 12))


def pause_seconds() -> float:
    """The pause between text deltas: THREADLINE_DEMO_DELAY_MS as for the demo agent (30 ms
    unless set; the tests set 0), so a browser shows the text streaming."""
    try:
        return max(0.0, float(os.environ.get("THREADLINE_DEMO_DELAY_MS") or 30)) / 1000
    except ValueError:
        return 0.03


async def weather_model(request: ModelRequest) -> AsyncIterator[ModelDelta]:
    """The FunctionModel's function: streams `plan`, pausing `pause_seconds()` between text
    deltas."""
    delay = pause_seconds()
    for index, delta in enumerate(plan(request)):
        if index and isinstance(delta, TextDelta):
            await asyncio.sleep(delay)
        yield delta


def build_model() -> Model:
    """The deterministic FunctionModel, or a real provider named by WEATHER_AGENT_MODEL.

    The same switch in code, without the environment:

        from runtime import AnthropicModel, OpenAICompatModel
        model = OpenAICompatModel("gpt-4o-mini")                      # OPENAI_API_KEY
        model = OpenAICompatModel("llama3.1", base_url="http://127.0.0.1:11434/v1")  # Ollama
        model = OpenAICompatModel("my-model", base_url="http://127.0.0.1:8080/v1")   # llama.cpp
        model = AnthropicModel("claude-3-5-haiku-latest", max_tokens=1024)  # ANTHROPIC_API_KEY
    """
    spec = os.environ.get("WEATHER_AGENT_MODEL", "").strip()
    if not spec:
        return FunctionModel(weather_model, name="weather-example")
    provider, _, name = spec.partition(":")
    base_url = os.environ.get("WEATHER_AGENT_BASE_URL") or None
    if provider == "openai" and name:
        from runtime import OpenAICompatModel

        return OpenAICompatModel(name, base_url=base_url, temperature=0.2)
    if provider == "anthropic" and name:
        from runtime import AnthropicModel

        return AnthropicModel(name, base_url=base_url, max_tokens=1024)
    raise ValueError(f"WEATHER_AGENT_MODEL={spec!r}: use openai:<model> or anthropic:<model>")


def agent() -> Agent:
    """The factory THREADLINE_AGENT=examples.weather_agent:agent loads (once per process)."""
    return Agent(
        model=build_model(),
        instructions=INSTRUCTIONS,
        tools=[get_forecast, subscribe_alerts],
        lifecycle=weather_lifecycle(),
        max_steps=4,
        name="weather",
    )


# --- run one conversation in-process: python examples/weather_agent.py ---------------------------


def _assistant_text(snapshot: Snapshot) -> str:
    for message in reversed(snapshot.messages):
        if message.role is MessageRole.ASSISTANT:
            return "".join(p.text for p in message.parts if isinstance(p, TextPart))
    return ""


async def _main() -> None:
    import tempfile

    from realtime import MemoryBus
    from runtime import Principal, Publisher, Role, RunStatus, SqliteStore, ThreadService, Worker

    settled = (RunStatus.WAITING, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
    user = Principal(subject="alice", role=Role.USER, scopes=frozenset({"demo"}))

    async def settle(thread_id: str) -> Snapshot:
        for _ in range(500):
            snapshot = await store.snapshot(thread_id, user.scopes)
            if snapshot.run is not None and snapshot.run.status in settled:
                return snapshot
            await asyncio.sleep(0.02)
        raise TimeoutError("the run did not settle")

    with tempfile.TemporaryDirectory() as directory:
        async with SqliteStore(f"{directory}/weather.sqlite3") as store, MemoryBus() as bus:
            weather = agent()
            service = ThreadService(store, Publisher(bus), weather)
            async with Worker(store, bus, weather, poll_interval=0.05):
                thread_id = (await service.create_thread(user, title="weather")).thread.id
                for text in ("forecast for Lisbon for 3 days", "what is the admin password?"):
                    print(f"> {text}")
                    await service.send_message(user, thread_id, text)
                    print(_assistant_text(await settle(thread_id)))
                print("> alert ops@example.com about storms in Oslo")
                await service.send_message(
                    user, thread_id, "alert ops@example.com about storms in Oslo"
                )
                action = (await settle(thread_id)).pending_actions[0]
                print(f"pending action {action.id}: {action.tool_name}({action.input})")
                approval = AlertApproval(approved=True, channel="sms")
                await service.resume_action(user, thread_id, action.id, approval.model_dump())
                print(_assistant_text(await settle(thread_id)))


if __name__ == "__main__":
    asyncio.run(_main())
