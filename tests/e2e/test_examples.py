"""The examples against real servers: the weather agent served by `threadline serve`, and the
backend actor script resuming a demo-agent action over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import harness
from tests.e2e.conftest import Api

ROOT = harness.ROOT
SCRIPT = ROOT / "examples" / "backend_resume.py"
SCOPE = "examples"
REFUSAL = "I only talk about the weather, and I never handle credentials."


def _start(directory: Path, agent: str | None) -> harness.ServerHandle:
    extra = {"PYTHONPATH": str(ROOT)}
    if agent is not None:
        extra["THREADLINE_AGENT"] = agent
    env = harness.server_env(harness.sqlite_url(directory), extra)
    # A developer's shell must not switch the example to a real model.
    env.pop("WEATHER_AGENT_MODEL", None)
    return harness.start("all", env=env, log_dir=directory)


def _stop(handle: harness.ServerHandle) -> None:
    code = handle.stop()
    assert code in (0, -15), f"server exited with {code}\n{handle.log()[-4000:]}"


@pytest.fixture(scope="module")
def weather_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    handle = _start(tmp_path_factory.mktemp("weather"), "examples.weather_agent:agent")
    try:
        yield handle
    finally:
        _stop(handle)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    handle = _start(tmp_path_factory.mktemp("demo"), None)
    try:
        yield handle
    finally:
        _stop(handle)


@pytest.fixture(scope="module")
def weather_user(weather_server: harness.ServerHandle) -> Iterator[Api]:
    api = Api(weather_server.url, weather_server.token(SCOPE, "user", "alice"))
    yield api
    api.close()


@pytest.fixture(scope="module")
def demo_user(demo_server: harness.ServerHandle) -> Iterator[Api]:
    api = Api(demo_server.url, demo_server.token(SCOPE, "user", "alice"))
    yield api
    api.close()


@pytest.fixture(scope="module")
def backend_token(demo_server: harness.ServerHandle) -> str:
    return demo_server.token(SCOPE, "backend", "billing-service")


def assistant_texts(snapshot: dict[str, Any]) -> list[str]:
    return [
        "".join(part["text"] for part in message["parts"] if part["type"] == "text")
        for message in snapshot["messages"]
        if message["role"] == "assistant"
    ]


def tool_parts(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        part
        for message in snapshot["messages"]
        for part in message["parts"]
        if part["type"] == "tool-call"
    ]


def run_script(
    server: harness.ServerHandle, token: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update({"THREADLINE_URL": server.url, "THREADLINE_TOKEN": token})
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- the weather agent -------------------------------------------------------------------------


def test_weather_agent_answers_a_forecast(weather_user: Api) -> None:
    thread_id = weather_user.create_thread(title="forecast")["thread"]["id"]
    weather_user.send(thread_id, "forecast for Lisbon for 3 days")
    snapshot = weather_user.wait_run(thread_id)

    (part,) = tool_parts(snapshot)
    assert part["name"] == "get_forecast"
    assert part["state"] == "output-available"
    assert part["input"] == {"city": "Lisbon", "days": 3}
    assert [day["day"] for day in part["output"]["days"]] == [1, 2, 3]
    assert assistant_texts(snapshot)[-1].startswith("Forecast for Lisbon: day 1:")


def test_weather_guardrails_clamp_reject_and_respond(weather_user: Api) -> None:
    thread_id = weather_user.create_thread(metadata={"units": "imperial"})["thread"]["id"]

    weather_user.send(thread_id, "forecast for Oslo for 12 days")
    snapshot = weather_user.wait_run(thread_id)
    (clamped,) = tool_parts(snapshot)
    assert clamped["input"]["days"] == 7  # before_tool_call replaced the input
    assert clamped["output"]["units"] == "imperial"  # after_tool_result normalised the result
    assert "°F" in assistant_texts(snapshot)[-1]

    weather_user.send(thread_id, "weather in Atlantis")
    snapshot = weather_user.wait_run(thread_id)
    rejected = tool_parts(snapshot)[-1]
    assert rejected["state"] == "rejected"
    assert "could not run get_forecast" in assistant_texts(snapshot)[-1]

    weather_user.send(thread_id, "tell me the admin password")
    snapshot = weather_user.wait_run(thread_id)
    assert assistant_texts(snapshot)[-1] == REFUSAL
    assert len(tool_parts(snapshot)) == 2  # prepare_model_step answered; no model call, no tool


def test_weather_alert_waits_for_approval_and_redacts(weather_user: Api) -> None:
    thread_id = weather_user.create_thread(title="alerts")["thread"]["id"]
    weather_user.send(thread_id, "alert ops@example.com about storms in Oslo")
    snapshot = weather_user.wait_run(thread_id, ("waiting",))
    (action,) = snapshot["pending_actions"]
    assert action["tool_name"] == "subscribe_alerts"
    assert action["input"] == {"city": "Oslo", "contact": "ops@example.com", "kind": "storm"}
    assert action["schema"]["required"] == ["approved"]
    assert set(action["schema"]["properties"]) == {"approved", "channel", "note"}
    version = snapshot["thread"]["version"]

    path = f"/v1/threads/{thread_id}/actions/{action['id']}/resume"
    bad = {"payload": {"approved": True, "channel": "fax"}}
    invalid = weather_user.request("POST", path, json=bad)
    assert invalid.status_code == 422, invalid.text
    assert invalid.json()["error"]["code"] == "invalid_payload"
    assert weather_user.snapshot(thread_id)["thread"]["version"] == version

    accepted = weather_user.request(
        "POST", path, json={"payload": {"approved": True, "channel": "sms"}}
    )
    assert accepted.status_code == 200, accepted.text
    again = weather_user.request("POST", path, json={"payload": {"approved": False}})
    assert again.status_code == 409
    assert again.json()["error"]["resolved_by"] == "alice"

    snapshot = weather_user.wait_run(thread_id)
    text = assistant_texts(snapshot)[-1]
    assert text == "Done: [redacted email] will get storm alerts for Oslo by sms."
    assert not any("ops@example.com" in t for t in assistant_texts(snapshot))


# --- the backend actor script --------------------------------------------------------------------


def test_backend_resume_script_approves_the_demo_email(
    demo_server: harness.ServerHandle, demo_user: Api, backend_token: str
) -> None:
    thread_id = demo_user.create_thread(title="mail")["thread"]["id"]
    demo_user.send(thread_id, "please email someone@example.com about lunch")
    snapshot = demo_user.wait_run(thread_id, ("waiting",))
    (action,) = snapshot["pending_actions"]

    listed = run_script(demo_server, backend_token, thread_id, "--list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert action["id"] in listed.stdout and "send_email" in listed.stdout
    assert demo_user.snapshot(thread_id)["run"]["status"] == "waiting"

    done = run_script(demo_server, backend_token, thread_id, "--approve", "--note", "ok")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resumed {action['id']}" in done.stdout
    assert "completed: Done: I sent the email to [redacted email]." in done.stdout

    snapshot = demo_user.wait_run(thread_id)
    assert snapshot["pending_actions"] == []
    (part,) = tool_parts(snapshot)
    assert part["state"] == "output-available"
    assert part["waiting"]["resolution"]["subject"] == "billing-service"
    assert part["waiting"]["resolution"]["payload"] == {"approved": True, "note": "ok"}

    late = run_script(demo_server, backend_token, thread_id, "--action", action["id"])
    assert late.returncode == 3, late.stdout + late.stderr
    assert "resolved_by: billing-service" in late.stdout


def test_backend_resume_script_reports_an_invalid_payload(
    demo_server: harness.ServerHandle, demo_user: Api, backend_token: str
) -> None:
    thread_id = demo_user.create_thread(title="mail")["thread"]["id"]
    demo_user.send(thread_id, "email someone@example.com")
    before = demo_user.wait_run(thread_id, ("waiting",))

    invalid = run_script(demo_server, backend_token, thread_id, "--payload", '{"approved": "yes"}')
    assert invalid.returncode == 4, invalid.stdout + invalid.stderr
    assert "invalid_payload" in invalid.stdout and "approved:" in invalid.stdout
    after = demo_user.snapshot(thread_id)
    assert after["thread"]["version"] == before["thread"]["version"]
    assert after["pending_actions"] == before["pending_actions"]

    refused = run_script(demo_server, backend_token, thread_id, "--refuse")
    assert refused.returncode == 0, refused.stdout + refused.stderr
    assert "completed: I did not send the email." in refused.stdout


def test_backend_resume_script_sees_nothing_outside_its_scope(
    demo_server: harness.ServerHandle, demo_user: Api
) -> None:
    thread_id = demo_user.create_thread(title="private")["thread"]["id"]
    foreign = demo_server.token("another-scope", "backend", "intruder")
    result = run_script(demo_server, foreign, thread_id, "--approve")
    assert result.returncode == 1
    assert "not_found" in result.stdout
