"""The AI SDK's own chat logic and DefaultChatTransport (npm `ai`, run with node) against a real
Threadline server speaking the UI message stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import harness, jsclients
from tests.e2e.effects_agent import EFFECTS_ENV
from tests.e2e.jsclients import drive, long_text, snapshot

ADDRESS = "erin.roe@example.com"

# The shared fixtures of tests/e2e/jsclients.py (this module gets its own server).
node, server, tokens = jsclients.node, jsclients.server, jsclients.tokens


def chat(node: str, server: harness.ServerHandle, token: str, **options: Any) -> dict[str, Any]:
    chat_id = f"chat-{uuid.uuid4().hex}"
    report = drive(
        node, "aisdk_driver.mjs", {"url": server.url, "token": token, "chatId": chat_id, **options}
    )
    report["chatId"] = chat_id
    report["snapshot"] = snapshot(server.url, token, chat_id)
    assert report["errors"] == [], report["errors"]
    return report


def chunks(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in report["raw"] if line != "[DONE]"]


def run_text(snap: dict[str, Any], run_id: str) -> str:
    """The committed assistant text of one run, over all its step messages."""
    return "".join(
        part["text"]
        for message in snap["messages"]
        if message["role"] == "assistant" and message.get("run_id") == run_id
        for part in message["parts"]
        if part["type"] == "text"
    )


def ui_text(message: dict[str, Any]) -> str:
    return "".join(part["text"] for part in message["parts"] if part["type"] == "text")


def test_streamed_text_and_tool_parts(
    node: str, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    report = chat(node, server, tokens["alice"], text="weather in Oslo please")
    assert report["status"] == "ready"
    types = [c["type"] for c in chunks(report)]
    assert types[0] == "start" and types[-1] == "finish"
    for kind in (
        "start-step",
        "tool-input-start",
        "tool-input-delta",
        "tool-input-available",
        "tool-output-available",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
    ):
        assert kind in types, types
    snap = report["snapshot"]
    user, assistant = report["messages"]
    assert user["role"] == "user" and assistant["id"] == snap["run"]["id"]
    [tool] = [p for p in assistant["parts"] if p["type"] == "tool-get_weather"]
    committed = next(p for m in snap["messages"] for p in m["parts"] if p["type"] == "tool-call")
    assert tool["state"] == "output-available" and tool["toolCallId"] == committed["tool_call_id"]
    assert tool["input"] == committed["input"] and tool["output"] == committed["output"]
    assert ui_text(assistant) == run_text(snap, snap["run"]["id"])
    assert "Oslo" in ui_text(assistant)


def test_approval_round_trip_resumes_the_action(
    node: str, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    report = chat(
        node,
        server,
        tokens["alice"],
        text=f"email {ADDRESS} about lunch",
        approve={"approved": True},
    )
    requests = [c for c in chunks(report) if c["type"] == "tool-approval-request"]
    assert [r["approvalId"] for r in requests] == [report["approvalId"]]
    snap = report["snapshot"]
    assert snap["run"]["status"] == "completed" and not snap["pending_actions"]
    assistant = report["messages"][-1]
    [tool] = [p for p in assistant["parts"] if p["type"] == "tool-send_email"]
    assert tool["state"] == "output-available"
    assert tool["approval"] == {"id": report["approvalId"], "approved": True}
    assert ui_text(assistant) == run_text(snap, snap["run"]["id"])
    assert "[redacted email]" in ui_text(assistant)
    deltas = [c["delta"] for c in chunks(report) if c["type"] == "text-delta"]
    assert deltas and all(ADDRESS not in delta for delta in deltas)


def test_reconnect_resumes_the_stream_in_flight(
    node: str, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    report = chat(node, server, tokens["alice"], text=long_text(), stopAfterDeltas=3)
    resumed = report["resumed"]
    # Cut after 3 deltas (a chunk already read may still arrive); the reply has 200.
    assert resumed["status"] == "ready" and 3 <= resumed["deltasBeforeStop"] < 10
    snap = report["snapshot"]
    # The SDK's stop() only closes its own request; the run goes on and the resume shows it all.
    assert snap["run"]["status"] == "completed"
    user, assistant = resumed["messages"]
    assert user["role"] == "user"
    assert assistant["id"] == snap["run"]["id"]
    assert ui_text(assistant) == run_text(snap, snap["run"]["id"])
    assert "word199" in ui_text(assistant)


def test_resume_route_answers_204_without_a_run_and_404_for_foreign_chats(
    node: str, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    report = chat(node, server, tokens["alice"], text="hello there")
    url = f"{server.url}/v1/ai-sdk/chat/{report['chatId']}/stream"
    mine = httpx.get(url, headers={"Authorization": f"Bearer {tokens['alice']}"}, timeout=10.0)
    assert mine.status_code == 204
    foreign = httpx.get(url, headers={"Authorization": f"Bearer {tokens['carol']}"}, timeout=10.0)
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
    body = {"id": report["chatId"], "messages": [], "trigger": "submit-message"}
    refused = httpx.post(
        f"{server.url}/v1/ai-sdk/chat",
        json=body,
        timeout=10.0,
        headers={"Authorization": f"Bearer {tokens['alice']}"},
    )
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_input"


def test_stream_headers(server: harness.ServerHandle, tokens: dict[str, str]) -> None:
    body = {
        "id": f"chat-{uuid.uuid4().hex}",
        "trigger": "submit-message",
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
    }
    with httpx.stream(
        "POST",
        f"{server.url}/v1/ai-sdk/chat",
        json=body,
        timeout=10.0,
        headers={"Authorization": f"Bearer {tokens['alice']}"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_stop_through_the_documented_route_stops_the_run(
    node: str, server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    report = chat(node, server, tokens["alice"], text=long_text(), stopRouteAfterDeltas=3)
    snap = report["snapshot"]
    assert snap["run"]["status"] == "cancelled"
    assert report["stopAnswer"]["run_id"] == snap["run"]["id"]
    assert report["status"] == "ready"
    assistant = report["messages"][-1]
    assert assistant["id"] == snap["run"]["id"]
    assert "word199" not in ui_text(assistant)
    # The closed tab of test_reconnect_resumes_the_stream_in_flight (the SDK's stop() alone)
    # leaves its run going to completion; this one ended it for everyone.
    later = httpx.get(
        f"{server.url}/v1/ai-sdk/chat/{report['chatId']}/stream",
        headers={"Authorization": f"Bearer {tokens['alice']}"},
        timeout=10.0,
    )
    assert later.status_code == 204


def test_stop_route_refusals(server: harness.ServerHandle, tokens: dict[str, str]) -> None:
    url = f"{server.url}/v1/ai-sdk/chat/chat-{uuid.uuid4().hex}/stop"
    assert httpx.post(url, timeout=10.0).status_code == 401
    missing = httpx.post(url, headers={"Authorization": f"Bearer {tokens['alice']}"}, timeout=10.0)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


@pytest.fixture(scope="module")
def effects(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[harness.ServerHandle, Path]]:
    """A server whose `send_email` records each execution in a file (tests/e2e/effects_agent)."""
    directory = tmp_path_factory.mktemp("effects")
    effects_file = directory / "effects"
    effects_file.touch()
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "PYTHONPATH": str(harness.ROOT),
            "THREADLINE_AGENT": "tests.e2e.effects_agent:agent",
            EFFECTS_ENV: str(effects_file),
        },
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle, effects_file


@pytest.mark.parametrize("approved", [False, True])
def test_denial_ends_output_denied_without_running_the_tool(
    node: str, effects: tuple[harness.ServerHandle, Path], approved: bool
) -> None:
    server, effects_file = effects
    token = server.token("alpha", "user", "alice")
    before = effects_file.read_text().splitlines()
    report = chat(
        node,
        server,
        token,
        text=f"email {ADDRESS} about lunch",
        approve={"approved": approved, "reason": "not today"},
    )
    snap = report["snapshot"]
    assert snap["run"]["status"] == "completed" and not snap["pending_actions"]
    [tool] = [p for p in report["messages"][-1]["parts"] if p["type"] == "tool-send_email"]
    ran = effects_file.read_text().splitlines()[len(before) :]
    if approved:
        # The same round trip approved: the tool ran once (the counter can count).
        assert tool["state"] == "output-available" and ran == [tool["toolCallId"]]
        return
    assert tool["state"] == "output-denied"
    assert tool["approval"] == {
        "id": report["approvalId"],
        "approved": False,
        "reason": "not today",
    }
    assert ran == []  # never executed
    [committed] = [p for m in snap["messages"] for p in m["parts"] if p["type"] == "tool-call"]
    assert committed["state"] == "rejected" and committed["error"] == "denied: not today"
    assert "tool-output-denied" in [c["type"] for c in chunks(report)]
    assert ui_text(report["messages"][-1]) == "I did not send the email. Note: not today"
