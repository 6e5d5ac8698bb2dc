"""The checker's stream-framing rules against the protocols' own clients: a sequence the rule
passes is one @ag-ui/client's HttpAgent (its event verifier) or the `ai` package's chat
(useChat's core) takes, fed the same bytes (tests/js/stream_verdict.mjs); the rule flags what
the AG-UI verifier rejects, and AI SDK streams ending in neither `finish` nor `error`.

Stricter than the verifier, and kept: one run per AG-UI answer (the verifier would take a
second RUN_STARTED after the first run's end; Threadline never sends one)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.campaign.history import Stream
from tests.campaign.stream_rules import StreamRules
from tests.e2e.jsclients import drive, require_node_clients

UNAVAILABLE = {"message": "the server is shutting down; the run goes on", "code": "unavailable"}
STARTED = {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}
FINISHED = {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}
TEXT_START = {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}

# Sequences the campaign recorded (seed 1, 2 minutes): refused before the run started
# (the feed's first read failed: a gateway draining, the store cut), and cut mid-run.
AG_UI_ACCEPTED: dict[str, list[dict[str, Any]]] = {
    "a lone RUN_ERROR": [{"type": "RUN_ERROR", **UNAVAILABLE}],
    "started then RUN_ERROR": [STARTED, {"type": "RUN_ERROR", **UNAVAILABLE}],
    "started then finished": [STARTED, FINISHED],
}
AG_UI_REJECTED: dict[str, list[dict[str, Any]]] = {
    "text before the run": [TEXT_START],
    "text after RUN_ERROR": [{"type": "RUN_ERROR", **UNAVAILABLE}, TEXT_START],
    "text after RUN_FINISHED": [STARTED, FINISHED, TEXT_START],
}
START = {"type": "start", "messageId": "r"}
TEXT = [
    {"type": "text-start", "id": "x"},
    {"type": "text-delta", "id": "x", "delta": "hi"},
]
AI_SDK_ACCEPTED: dict[str, list[dict[str, Any]]] = {
    "an error part mid-text": [
        START,
        *TEXT,
        {"type": "error", "errorText": UNAVAILABLE["message"]},
    ],
    "an error part at once": [START, {"type": "error", "errorText": "the store is unavailable"}],
    "finish": [START, *TEXT, {"type": "text-end", "id": "x"}, {"type": "finish"}],
}


def framing(transport: str, events: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    stream = Stream("c0/s0", transport, "t", start=0.0, end=1.0, status=200)
    stream.events, stream.closed, stream.done = events, True, transport == "ai-sdk"
    StreamRules([], [], [], lambda rule, detail: found.append(f"{rule}: {detail}")).check(stream)
    return found


def verdict(transport: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    options = {"transport": transport, "events": events, "done": transport == "ai-sdk"}
    return drive(require_node_clients(), "stream_verdict.mjs", options)


@pytest.mark.parametrize("name", AG_UI_ACCEPTED)
def test_ag_ui_sequences_the_verifier_takes_pass_the_rule(name: str) -> None:
    events = AG_UI_ACCEPTED[name]
    assert verdict("ag-ui", events)["verdict"] == "accepted"
    assert framing("ag-ui", events) == []


@pytest.mark.parametrize("name", AG_UI_REJECTED)
def test_ag_ui_sequences_the_verifier_rejects_are_flagged(name: str) -> None:
    events = AG_UI_REJECTED[name]
    assert verdict("ag-ui", events)["verdict"] == "rejected"
    assert any("stream framing" in v for v in framing("ag-ui", events))


@pytest.mark.parametrize("name", AI_SDK_ACCEPTED)
def test_ai_sdk_streams_ending_in_error_or_finish_pass_the_rule(name: str) -> None:
    events = AI_SDK_ACCEPTED[name]
    report = verdict("ai-sdk", events)
    assert report["verdict"] == "accepted"
    # An `error` part is the stream's own error: the chat ends in its error state with it.
    ends_in_error = events[-1]["type"] == "error"
    assert report["status"] == ("error" if ends_in_error else "ready")
    assert framing("ai-sdk", events) == []


def test_an_ai_sdk_stream_ending_in_neither_is_flagged() -> None:
    """The chat takes it silently (ready, half a text): the server never ends so, the rule
    keeps it a violation."""
    events = [START, *TEXT]
    assert verdict("ai-sdk", events)["status"] == "ready"
    assert any("[DONE] without finish or error" in v for v in framing("ai-sdk", events))
