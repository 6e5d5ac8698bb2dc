"""The demo model: deterministic decisions from the conversation, streamed like a real provider."""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
import os
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.demo.redact import EMAIL
from runtime.domain import MAX_TEXT_CHARS, MessageRole, Part, ToolCallPart, ToolState
from runtime.providers.model_api import (
    ContextMessage,
    FinishDelta,
    ModelDelta,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from runtime.providers.model_context import message_text, message_turns, render_output
from runtime.providers.parts import generate_tool_call_id
from runtime.tools import DENIED

DELAY_ENV = "THREADLINE_DEMO_DELAY_MS"
DEFAULT_DELAY_MS = 30.0
# Small pieces: any address (at least 6 characters) is split across chunks, so the redactor's
# cross-chunk hold-back is exercised by every demo conversation that has one. Long replies get
# bigger pieces so that no reply takes more than MAX_CHUNKS pauses.
CHUNK_CHARS = 5
MAX_CHUNKS = 200

# The city runs from its first letter to punctuation or the end of the line.
WEATHER_REQUEST = re.compile(r"\bweather\s+in\s+([^\W\d_][^\n?!.,;:]*)", re.IGNORECASE)
EMAIL_REQUEST = re.compile(r"\bemail[\s:]+(?:to\s+)?(" + EMAIL.pattern + ")", re.IGNORECASE)


@dataclass(frozen=True)
class TextPlan:
    text: str


@dataclass(frozen=True)
class ToolCallPlan:
    name: str
    input: dict[str, Any]


Plan = TextPlan | ToolCallPlan


def decide(request: ModelRequest) -> Plan:
    """What the demo model answers to `request`.

    - last message from the user asking for `weather in <City>` -> call `get_weather`;
    - last message from the user containing `email <address>` -> call `send_email`;
    - last message from the assistant ending in tool results -> answer with the results;
    - anything else -> repeat the user's last text.
    A tool the request does not offer is never called.
    """
    # The last message that is not a system message (searched from the end: a long thread's
    # request holds hundreds).
    last = next((m for m in reversed(request.messages) if m.role is not MessageRole.SYSTEM), None)
    tools = {spec.name for spec in request.tools}
    if last is not None and last.role is MessageRole.USER:
        text = message_text(last.parts)
        weather = WEATHER_REQUEST.search(text)
        if weather and "get_weather" in tools:
            return ToolCallPlan("get_weather", {"city": weather.group(1).strip()})
        email = EMAIL_REQUEST.search(text)
        if email and "send_email" in tools:
            return ToolCallPlan("send_email", {"to": email.group(1), "body": text})
        return TextPlan(echo(text))
    if last is not None and last.role is MessageRole.ASSISTANT:
        answer = answer_tool_results(last.parts)
        if answer:
            return TextPlan(answer)
    return TextPlan(echo(_last_user_text(request.messages)))


def echo(text: str) -> str:
    if not text.strip():
        return "You said nothing."
    reply = f"You said: {text}"
    # The reply must still fit in one stored text part.
    return reply if len(reply) <= MAX_TEXT_CHARS else reply[: MAX_TEXT_CHARS - 1] + "…"


def _last_user_text(messages: Sequence[ContextMessage]) -> str:
    for message in reversed(messages):
        if message.role is MessageRole.USER:
            return message_text(message.parts)
    return ""


def answer_tool_results(parts: tuple[Part, ...] | list[Part]) -> str | None:
    """An answer about the tool calls that end the message, once they all have final results."""
    turns = message_turns(parts)
    if not turns or not turns[-1].tool_calls:
        return None
    calls = turns[-1].tool_calls
    if not all(call.state.is_final for call in calls):
        return None
    return " ".join(_answer(call) for call in calls)


def _answer(call: ToolCallPart) -> str:
    output = call.output if isinstance(call.output, dict) else {}
    done = call.state is ToolState.OUTPUT_AVAILABLE
    if call.name == "get_weather":
        city = output.get("city") or call.input.get("city") or "that city"
        if done and "conditions" in output and "temperature_c" in output:
            return f"The weather in {city} is {output['conditions']}, {output['temperature_c']}°C."
        return f"I could not get the weather for {city}: {call.error or call.state.value}."
    if call.name == "send_email":
        if done and output.get("sent") is True:
            to = output.get("to") or call.input.get("to") or "the recipient"
            return f"Done: I sent the email to {to}."
        note = output.get("note") or _denial_note(call)
        return "I did not send the email." + (f" Note: {note}" if note else "")
    if done:
        return f"The tool {call.name} returned: {render_output(call.output)}"
    return f"The tool {call.name} did not succeed: {call.error or call.state.value}."


def _denial_note(call: ToolCallPart) -> str | None:
    """The note of a denial (runtime.tools.denied_unless_approved's "denied: <note>")."""
    prefix = f"{DENIED}: "
    if call.state is ToolState.REJECTED and call.error and call.error.startswith(prefix):
        return call.error[len(prefix) :]
    return None


def _words(text: str) -> int:
    return len(text.split())


class _WordCounts:
    """Word counts of context messages by identity: the runtime hands a step the same parsed
    message objects as the step before (`runtime/engine/message_cache.py`), so each is counted
    once, not once per step. Holding the message keeps its id from being reused while it is cached.

    `total` also remembers each conversation's last request (by its first message): a request
    that starts with the same message objects adds only the words of the messages after them,
    without looking each earlier one up. The last of them may be a new object (the runtime
    re-reads the thread's tail message, the only one that can change): counted again."""

    def __init__(self, limit: int = 50_000, conversations: int = 256) -> None:
        self._counts: dict[int, tuple[ContextMessage, int]] = {}
        self._limit = limit
        # id(first message) -> (messages, their words, their words but the last message's)
        self._totals: dict[int, tuple[Sequence[ContextMessage], int, int]] = {}
        self._conversations = conversations

    def total(self, messages: Sequence[ContextMessage]) -> int:
        if not messages:
            return 0
        key = id(messages[0])
        known = self._totals.get(key)
        start, total = 0, 0
        if known is not None:
            before, words, words_but_last = known
            last = len(before) - 1
            if last < len(messages) and all(
                map(operator.is_, itertools.islice(before, last), messages)
            ):
                if before[last] is messages[last]:
                    start, total = last + 1, words
                else:
                    start, total = last, words_but_last
        total += sum(map(self, messages[start:]))
        if len(self._totals) >= self._conversations:
            self._totals.clear()
        # Holding the messages keeps the first one's id from being reused while it is a key.
        self._totals[key] = (messages, total, total - self(messages[-1]))
        return total

    def __call__(self, message: ContextMessage) -> int:
        cached = self._counts.get(id(message))
        if cached is not None and cached[0] is message:
            return cached[1]
        count = _words(message_text(message.parts))
        if len(self._counts) >= self._limit:
            self._counts.clear()
        self._counts[id(message)] = (message, count)
        return count


_word_counts = _WordCounts()


def _context_words(request: ModelRequest) -> int:
    return _words(request.instructions) + _word_counts.total(request.messages)


def split_chunks(text: str) -> list[str]:
    size = max(CHUNK_CHARS, -(-len(text) // MAX_CHUNKS))
    return [text[i : i + size] for i in range(0, len(text), size)]


def delay_seconds() -> float:
    """The pause between streamed pieces, read from the environment at stream time."""
    raw = os.environ.get(DELAY_ENV, "")
    try:
        delay_ms = float(raw) if raw.strip() else DEFAULT_DELAY_MS
    except ValueError:
        delay_ms = DEFAULT_DELAY_MS
    return max(0.0, delay_ms) / 1000.0


class DemoModel:
    """A deterministic model that needs no key. `delay_ms` overrides THREADLINE_DEMO_DELAY_MS."""

    name = "demo"

    def __init__(self, delay_ms: float | None = None) -> None:
        self.delay_ms = delay_ms

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        return self._stream(request)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        delay = delay_seconds() if self.delay_ms is None else max(0.0, self.delay_ms) / 1000.0
        plan = decide(request)
        input_tokens = _context_words(request)
        if isinstance(plan, ToolCallPlan):
            arguments = json.dumps(plan.input, ensure_ascii=False)
            half = len(arguments) // 2
            yield ToolCallDelta(
                index=0, id=generate_tool_call_id(), name=plan.name, arguments=arguments[:half]
            )
            await asyncio.sleep(delay)
            yield ToolCallDelta(index=0, arguments=arguments[half:])
            yield UsageDelta(input_tokens=input_tokens, output_tokens=_words(arguments))
            yield FinishDelta(reason="tool_calls")
            return
        for index, piece in enumerate(split_chunks(plan.text)):
            if index:
                await asyncio.sleep(delay)
            yield TextDelta(text=piece)
        yield UsageDelta(input_tokens=input_tokens, output_tokens=_words(plan.text))
        yield FinishDelta(reason="stop")
