"""The official AG-UI client (@ag-ui/client, run with node) against a real Threadline server."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import Event
from pydantic import TypeAdapter

from tests.e2e import harness, jsclients
from tests.e2e.jsclients import drive, finish_driver, long_text, snapshot, start_driver, wait_for

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
FINAL = {"output-available", "output-error", "rejected", "cancelled", "skipped"}
ADDRESS = "dave.doe@example.com"

# The shared fixtures of tests/e2e/jsclients.py (this module gets its own server).
node, server, tokens = jsclients.node, jsclients.server, jsclients.tokens


class Agui:
    """One AG-UI client process per call, on one thread."""

    def __init__(self, node: str, server: harness.ServerHandle, token: str) -> None:
        self.node, self.server, self.token = node, server, token
        self.thread_id = f"agui-{uuid.uuid4().hex}"

    def options(self, token: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "url": self.server.url,
            "token": token or self.token,
            "threadId": self.thread_id,
            # The Threadline id of the client's thread, for the HTTP stop route.
            "threadlineId": jsclients.thread_id_of(
                self.server.url, token or self.token, self.thread_id
            ),
            **extra,
        }

    def run(self, token: str | None = None, **extra: Any) -> dict[str, Any]:
        report = drive(self.node, "agui_driver.mjs", self.options(token, **extra))
        validate(report)
        return report

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self.server.url, self.token, self.thread_id)


@pytest.fixture
def agui(node: str, server: harness.ServerHandle, tokens: dict[str, str]) -> Agui:
    return Agui(node, server, tokens["alice"])


def validate(report: dict[str, Any]) -> None:
    """Every event the server sent validates against ag-ui-protocol's models."""
    assert report["raw"], (report["error"], report["events"])
    for line in report["raw"]:
        EVENTS.validate_json(line)


def expected_messages(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """The committed snapshot as AG-UI messages, per the mapping in docs/protocol.md."""
    out: list[dict[str, Any]] = []
    for message in snap["messages"]:
        text = "".join(p["text"] for p in message["parts"] if p["type"] == "text")
        calls = [p for p in message["parts"] if p["type"] == "tool-call"]
        if message["role"] == "user":
            out.append({"id": message["id"], "role": "user", "content": text})
            continue
        entry: dict[str, Any] = {"id": message["id"], "role": "assistant"}
        if text:
            entry["content"] = text
        if calls:
            entry["toolCalls"] = [
                {
                    "id": p["tool_call_id"],
                    "type": "function",
                    "function": {"name": p["name"], "arguments": p["input"]},
                }
                for p in calls
            ]
        out.append(entry)
        for p in calls:
            if p["state"] in FINAL:
                content = (
                    p["output"]
                    if p["state"] == "output-available"
                    else {"state": p["state"], "error": p.get("error")}
                )
                out.append(
                    {
                        "id": f"result-{p['tool_call_id']}",
                        "role": "tool",
                        "toolCallId": p["tool_call_id"],
                        "content": content,
                    }
                )
    return out


def expected_state(snap: dict[str, Any]) -> dict[str, Any]:
    """AG-UI shared state per docs/protocol.md: the thread's last run and pending actions."""
    run = snap["run"]
    return {
        "run": run and {"id": run["id"], "status": run["status"]},
        "pendingActions": [
            {
                "id": a["id"],
                "kind": a["kind"],
                "toolName": a["tool_name"],
                "toolCallId": a["tool_call_id"],
                "runId": a["run_id"],
                "allowedRoles": a["allowed_roles"],
            }
            for a in snap["pending_actions"]
        ],
    }


def reconstructed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The client's messages, with JSON strings parsed so both sides compare as data."""
    out = []
    for message in copy.deepcopy(messages):
        message = {k: v for k, v in message.items() if v is not None}
        if message["role"] == "tool":
            message["content"] = json.loads(message["content"])
        for call in message.get("toolCalls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        out.append(message)
    return out


def assert_converged(report: dict[str, Any], snap: dict[str, Any]) -> None:
    assert reconstructed(report["messages"]) == expected_messages(snap)


def event_types(report: dict[str, Any]) -> list[str]:
    return [event["type"] for event in report["events"]]


def streamed_text(report: dict[str, Any]) -> str:
    return "".join(e["delta"] for e in report["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")


def assistant_texts(report: dict[str, Any]) -> list[str]:
    """Every piece of assistant text in the raw events: deltas, and snapshot contents."""
    texts = []
    for line in report["raw"]:
        event = json.loads(line)
        if event["type"] == "TEXT_MESSAGE_CONTENT":
            texts.append(event["delta"])
        if event["type"] == "MESSAGES_SNAPSHOT":
            texts += [m.get("content") or "" for m in event["messages"] if m["role"] == "assistant"]
    return texts


def last_assistant_text(snap: dict[str, Any]) -> str:
    message = snap["messages"][-1]
    assert message["role"] == "assistant"
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text")


def test_weather_run_streams_tool_call_and_text(agui: Agui) -> None:
    report = agui.run(text="What is the weather in Paris?")
    assert report["error"] is None and report["outcome"] == "success"
    types = event_types(report)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    for kind in (
        "STEP_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
    ):
        assert kind in types, types
    start = next(e for e in report["events"] if e["type"] == "TOOL_CALL_START")
    assert start["toolCallName"] == "get_weather"
    snap = agui.snapshot()
    assert snap["run"]["status"] == "completed" and snap["run"]["id"] == report["runId"]
    assert streamed_text(report) == last_assistant_text(snap)
    assert "Paris" in streamed_text(report)
    assert_converged(report, snap)
    assert types[2] == "STATE_SNAPSHOT"  # after RUN_STARTED and MESSAGES_SNAPSHOT
    assert report["state"] == expected_state(snap)
    assert report["state"]["run"]["status"] == "completed"


def test_email_approval_resumed_by_a_second_client_exactly_once(
    agui: Agui, tokens: dict[str, str]
) -> None:
    first = agui.run(text=f"email {ADDRESS} to say hello")
    assert first["outcome"] == "interrupt", first["error"]
    [interrupt] = first["interrupts"]
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["responseSchema"]["required"] == ["approved"]
    snap = agui.snapshot()
    [action] = snap["pending_actions"]
    assert interrupt["id"] == action["id"] and interrupt["toolCallId"] == action["tool_call_id"]
    assert_converged(first, snap)
    # Shared state (STATE_SNAPSHOT, then STATE_DELTA patches applied by the client library):
    # the run waits on the one pending action.
    assert first["state"] == expected_state(snap)
    assert first["state"]["run"] == {"id": first["runId"], "status": "waiting"}
    assert "STATE_DELTA" in event_types(first)

    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    second = agui.run(tokens["bob"], resume=resume)
    assert second["error"] is None and second["outcome"] == "success"
    snap = agui.snapshot()
    assert snap["run"]["status"] == "completed" and not snap["pending_actions"]
    assert "[redacted email]" in last_assistant_text(snap)
    assert_converged(second, snap)
    assert second["state"] == expected_state(snap)
    assert second["state"]["pendingActions"] == []

    # The first client answers the same interrupt too late: RUN_ERROR naming the winner.
    late = agui.run(messages=first["messages"], resume=resume)
    errors = [json.loads(line) for line in late["raw"] if '"RUN_ERROR"' in line]
    assert [e["code"] for e in errors] == ["conflict"]
    assert errors[0]["metadata"]["resolved_by"] == "bob"
    assert event_types(late) == ["RUN_STARTED", "RUN_ERROR"]
    assert agui.snapshot()["thread"]["version"] == snap["thread"]["version"]
    for report in (first, second, late):
        assert all(ADDRESS not in text for text in assistant_texts(report))


def test_email_approval_resumed_by_a_backend_over_http(
    agui: Agui, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    first = agui.run(text=f"email {ADDRESS} the minutes")
    [interrupt] = first["interrupts"]
    response = httpx.post(
        f"{server.url}/v1/threads/{jsclients.thread_id_of(server.url, agui.token, agui.thread_id)}"
        f"/actions/{interrupt['id']}/resume",
        json={"payload": {"approved": False, "note": "not today"}},
        headers={"Authorization": f"Bearer {tokens['svc']}"},
        timeout=10.0,
    )
    assert response.status_code == 200, response.text
    # The client joins the thread (no new message): it converges on the outcome.
    joined = agui.run(messages=first["messages"])
    assert joined["error"] is None and joined["outcome"] == "success"
    snap = agui.snapshot()
    assert "did not send" in last_assistant_text(snap)
    assert_converged(joined, snap)


def test_stop_mid_stream_finishes_cancelled(agui: Agui) -> None:
    report = agui.run(text=long_text(), stopAfterDeltas=3)
    assert report["stopAnswer"] == 202
    assert report["outcome"] == "cancelled", (report["error"], event_types(report)[-3:])
    snap = agui.snapshot()
    assert snap["run"]["status"] == "cancelled"
    assert_converged(report, snap)


def test_second_client_joins_the_run_live(agui: Agui, node: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    # 400 chunks (20 s at 50 ms): the second node client must start and join while the run
    # streams; with 200 a loaded box once joined after the end (no live text to compare).
    streaming = start_driver(
        node, "agui_driver.mjs", agui.options(text=long_text(400), readyFile=str(ready))
    )
    wait_for(ready)
    joined = agui.run()  # a second client, no messages of its own: it joins
    assert joined["events"][2]["type"] == "STATE_SNAPSHOT"
    assert joined["events"][2]["snapshot"]["run"]["status"] == "running"  # it joined mid-run
    first = finish_driver(streaming)
    validate(first)
    snap = agui.snapshot()
    assert snap["run"]["status"] == "completed"
    assert joined["runId"] == first["runId"] == snap["run"]["id"]
    # Joined mid-step: the replay re-streams the step from its start, then live chunks follow.
    assert streamed_text(joined) == streamed_text(first) == last_assistant_text(snap)
    assert joined["events"][1]["type"] == "MESSAGES_SNAPSHOT"
    assert_converged(first, snap)
    assert_converged(joined, snap)


def test_reconnect_mid_stream_resumes_from_the_replay(agui: Agui) -> None:
    # 400 chunks (20 s): the reconnecting node client must join while the run still streams.
    cut = agui.run(text=long_text(400), abortAfterDeltas=3)
    assert cut["outcome"] is None  # aborted: the run itself goes on
    assert agui.snapshot()["run"]["status"] == "running"
    again = agui.run(messages=cut["messages"])
    assert again["outcome"] == "success" and again["runId"] == cut["runId"]
    assert again["events"][2]["snapshot"]["run"]["status"] == "running"  # rejoined mid-run
    snap = agui.snapshot()
    assert streamed_text(again) == last_assistant_text(snap)
    assert_converged(again, snap)


def test_redaction_holds_in_every_event(agui: Agui) -> None:
    report = agui.run(text=f"Please repeat my address {ADDRESS} back to me")
    assert report["outcome"] == "success"
    assert "[redacted email]" in streamed_text(report)
    assert all(ADDRESS not in text for text in assistant_texts(report))
    assert_converged(report, agui.snapshot())


def test_refusals_answer_json_before_any_stream(
    agui: Agui, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    body = {"threadId": agui.thread_id, "runId": "r", "messages": []}
    url = f"{server.url}/v1/ag-ui"
    assert httpx.post(url, json=body, timeout=10.0).status_code == 401
    bad = httpx.post(
        url, json={"runId": 1}, timeout=10.0, headers={"Authorization": f"Bearer {tokens['alice']}"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_input"
    agui.run()  # creates the thread in alice's scope
    before = agui.snapshot()
    # Another scope's id is a free one there (docs/protocol.md, "Thread ids"): carol joins a
    # thread of her own, and alice's is untouched.
    with httpx.stream(
        "POST", url, json=body, timeout=10.0, headers={"Authorization": f"Bearer {tokens['carol']}"}
    ) as foreign:
        assert foreign.status_code == 200
        lines = [line for line in foreign.iter_lines() if line.startswith("data:")]
    assert '"RUN_FINISHED"' in lines[-1]
    assert agui.snapshot() == before
