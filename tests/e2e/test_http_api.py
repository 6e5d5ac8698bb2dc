"""The HTTP API against a real `threadline serve` process: every route, its errors, its guards."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from server.app import create_app
from server.settings import Settings
from tests.e2e.conftest import VALID_BODIES, Api, assert_error, fill
from tests.e2e.harness import ServerHandle


def thread_routes() -> list[tuple[str, str, str]]:
    """(name, method, path) of every app route addressing one thread."""
    found = []
    for route in create_app(Settings(role="all")).routes:
        if isinstance(route, Route) and route.path.startswith("/v1/threads/{thread_id}"):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                found.append((route.name, method, route.path))
    return found


def authenticated_routes() -> list[tuple[str, str, str]]:
    found = []
    for route in create_app(Settings(role="all")).routes:
        if isinstance(route, Route) and route.path.startswith("/v1/"):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                found.append((route.name, method, route.path))
    return found


# --- basics ---------------------------------------------------------------------------


def test_healthz(server: ServerHandle) -> None:
    response = httpx.get(f"{server.url}/healthz", timeout=5)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_me(api_for: Any) -> None:
    assert api_for("alice").request("GET", "/v1/me").json() == {
        "subject": "alice",
        "role": "user",
        "scopes": ["alpha"],
        "name": "alice",  # no display name: the subject
    }
    assert api_for("multi").request("GET", "/v1/me").json()["scopes"] == ["alpha", "gamma"]


def test_static_index(server: ServerHandle) -> None:
    response = httpx.get(f"{server.url}/", timeout=5)
    assert response.status_code == 200
    assert "text/html" in response.headers["content-type"]
    assert httpx.get(f"{server.url}/static/index.html", timeout=5).status_code == 200


def test_unknown_route_and_method_are_json(alice: Api) -> None:
    assert_error(alice.request("GET", "/v1/nope"), 404, "not_found")
    assert_error(alice.request("PUT", "/v1/threads"), 405, "method_not_allowed")


# --- authentication -------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "tl_not-a-real-token", "garbage"])
def test_every_route_requires_a_valid_token(server: ServerHandle, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    routes = authenticated_routes()
    assert len(routes) >= 12
    with httpx.Client(base_url=server.url, headers=headers, timeout=10) as client:
        for _name, method, path in routes:
            response = client.request(method, fill(path, "thr-x"), json={})
            assert_error(response, 401, "unauthorized")


def test_non_bearer_scheme_is_unauthorized(server: ServerHandle, tokens: dict[str, str]) -> None:
    response = httpx.get(
        f"{server.url}/v1/me", headers={"Authorization": f"Basic {tokens['alice']}"}, timeout=5
    )
    assert_error(response, 401, "unauthorized")


# --- scope isolation ------------------------------------------------------------------


@pytest.mark.parametrize("intruder", ["carol", "beta_svc"])
def test_foreign_thread_is_not_found_on_every_route(api_for: Any, intruder: str) -> None:
    owner = api_for("alice")
    created = owner.create_thread(title="private")["thread"]
    thread_id = created["id"]
    other = api_for(intruder)
    routes = thread_routes()
    assert {name for name, _, _ in routes} <= set(VALID_BODIES), "add a body for new routes"
    for name, method, path in routes:
        kwargs = {} if VALID_BODIES[name] is None else {"json": VALID_BODIES[name]}
        foreign = other.request(method, fill(path, thread_id), **kwargs)
        missing = other.request(method, fill(path, f"thr-{uuid.uuid4().hex}"), **kwargs)
        if name == "manual_result" and intruder == "carol":
            # Role is checked before any lookup, so it cannot reveal existence either.
            assert_error(foreign, 403, "forbidden")
            assert_error(missing, 403, "forbidden")
            continue
        assert_error(foreign, 404, "not_found")
        assert_error(missing, 404, "not_found")
    # Nothing happened to the owner's thread.
    after = owner.snapshot(thread_id)
    assert after["thread"]["version"] == created["version"]
    assert after["messages"] == []


def test_list_threads_shows_only_own_scopes(api_for: Any) -> None:
    mine = api_for("alice").create_thread(title="alpha thread")["thread"]["id"]
    theirs = api_for("carol").create_thread(title="beta thread")["thread"]["id"]
    alpha_ids = {t["id"] for t in api_for("bob").request("GET", "/v1/threads").json()["threads"]}
    beta_ids = {t["id"] for t in api_for("carol").request("GET", "/v1/threads").json()["threads"]}
    assert mine in alpha_ids and theirs not in alpha_ids
    assert theirs in beta_ids and mine not in beta_ids


# --- threads --------------------------------------------------------------------------


def test_create_and_read_thread(alice: Api) -> None:
    snapshot = alice.create_thread(title="Trip", metadata={"color": "blue"})
    thread = snapshot["thread"]
    assert thread["title"] == "Trip"
    assert thread["scope"] == "alpha"
    assert thread["metadata"] == {"color": "blue"}
    assert isinstance(thread["version"], int)
    assert snapshot["messages"] == [] and snapshot["pending_actions"] == []
    assert snapshot["run"] is None and snapshot["queue"] == []
    assert alice.snapshot(thread["id"]) == snapshot
    listed = alice.request("GET", "/v1/threads").json()["threads"]
    entry = next(t for t in listed if t["id"] == thread["id"])
    assert entry["title"] == "Trip" and entry["version"] == thread["version"]
    assert "private_metadata" not in entry


def test_create_thread_with_several_scopes_needs_scope(api_for: Any) -> None:
    multi = api_for("multi")
    assert_error(multi.request("POST", "/v1/threads", json={}), 422, "invalid_input")
    assert multi.create_thread(scope="gamma")["thread"]["scope"] == "gamma"
    assert_error(
        api_for("alice").request("POST", "/v1/threads", json={"scope": "gamma"}),
        403,
        "forbidden",
    )


def test_body_errors(alice: Api) -> None:
    bad_json = alice.request(
        "POST", "/v1/threads", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(bad_json, 400, "invalid_json")
    extra_field = alice.request("POST", "/v1/threads", json={"nope": 1})
    extra = assert_error(extra_field, 422, "invalid_input")
    assert extra["errors"][0]["loc"] == ["nope"]
    not_object = alice.request("POST", "/v1/threads", json=[1, 2])
    assert_error(not_object, 422, "invalid_input")
    thread_id = alice.create_thread()["thread"]["id"]
    missing = alice.request("POST", f"/v1/threads/{thread_id}/messages", json={})
    assert assert_error(missing, 422, "invalid_input")["errors"][0]["loc"] == ["text"]
    bad_policy = alice.request(
        "POST", f"/v1/threads/{thread_id}/messages", json={"text": "x", "policy": "later"}
    )
    assert_error(bad_policy, 422, "invalid_input")
    too_long = alice.request(
        "POST", f"/v1/threads/{thread_id}/messages", json={"text": "x" * (64 * 1024 + 1)}
    )
    assert_error(too_long, 413, "too_large")
    assert_error(alice.request("GET", "/v1/threads?limit=abc"), 422, "invalid_input")
    huge = alice.request("POST", "/v1/threads", content=b" " * (1024 * 1024 + 1))
    assert_error(huge, 413, "too_large")
    assert alice.snapshot(thread_id)["messages"] == []


# --- messages and runs ----------------------------------------------------------------


def test_send_message_runs_the_agent(alice: Api) -> None:
    thread_id = alice.create_thread()["thread"]["id"]
    answer = alice.send(thread_id, "hello there")
    assert answer["thread_id"] == thread_id and isinstance(answer["version"], int)
    assert answer["run_id"]
    snapshot = alice.wait_run(thread_id)
    assert snapshot["run"]["id"] == answer["run_id"]
    roles = [m["role"] for m in snapshot["messages"]]
    assert roles[0] == "user" and roles[-1] == "assistant"
    reply = "".join(p.get("text", "") for p in snapshot["messages"][-1]["parts"])
    assert "hello there" in reply


def test_client_request_id_is_idempotent(alice: Api) -> None:
    thread_id = alice.create_thread()["thread"]["id"]
    first = alice.send(thread_id, "once only", client_request_id="req-1")
    second = alice.send(thread_id, "once only", client_request_id="req-1")
    assert second["run_id"] == first["run_id"]
    assert second.get("message_id") == first.get("message_id")
    snapshot = alice.wait_run(thread_id)
    user_texts = [m for m in snapshot["messages"] if m["role"] == "user"]
    assert len(user_texts) == 1


def test_weather_tool_call(alice: Api) -> None:
    thread_id = alice.create_thread()["thread"]["id"]
    alice.send(thread_id, "what is the weather in Paris?")
    snapshot = alice.wait_run(thread_id)
    parts = [p for m in snapshot["messages"] for p in m["parts"] if p["type"] == "tool-call"]
    assert parts and parts[0]["name"] == "get_weather"
    assert parts[0]["state"] == "output-available"


def _pending_email(api: Api) -> tuple[str, dict[str, Any], dict[str, Any]]:
    thread_id = api.create_thread()["thread"]["id"]
    api.send(thread_id, "please email bob@example.com the notes")
    snapshot = api.wait_run(thread_id, ("waiting",))
    (action,) = snapshot["pending_actions"]
    return thread_id, action, snapshot


def test_resume_invalid_payload_changes_nothing(alice: Api) -> None:
    thread_id, action, snapshot = _pending_email(alice)
    assert action["tool_name"] == "send_email"
    assert "approved" in action["schema"]["required"]
    path = f"/v1/threads/{thread_id}/actions/{action['id']}/resume"
    error = assert_error(
        alice.request("POST", path, json={"payload": {"approved": "maybe"}}), 422, "invalid_payload"
    )
    assert error["errors"] and all({"loc", "msg"} <= set(e) for e in error["errors"])
    assert_error(alice.request("POST", path, json={"payload": {}}), 422, "invalid_payload")
    assert_error(alice.request("POST", path, json={}), 422, "invalid_input")
    stale = {"payload": {"approved": True}, "expected_version": 0}
    version = snapshot["thread"]["version"]
    assert (
        assert_error(alice.request("POST", path, json=stale), 409, "conflict")["current_version"]
        == version
    )
    after = alice.snapshot(thread_id)
    assert after["thread"]["version"] == snapshot["thread"]["version"]
    assert after["pending_actions"] == snapshot["pending_actions"]


def test_concurrent_resumes_exactly_one_wins(api_for: Any, server: ServerHandle) -> None:
    alice, bob = api_for("alice"), api_for("bob")
    thread_id, action, _ = _pending_email(alice)
    path = f"/v1/threads/{thread_id}/actions/{action['id']}/resume"

    async def race() -> list[httpx.Response]:
        async def one(token: str | None) -> httpx.Response:
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
            ) as client:
                return await client.post(path, json={"payload": {"approved": True}})

        return list(await asyncio.gather(one(alice.token), one(bob.token)))

    responses = asyncio.run(race())
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 409], [r.text for r in responses]
    winner = "alice" if responses[0].status_code == 200 else "bob"
    loser = next(r for r in responses if r.status_code == 409)
    error = assert_error(loser, 409, "conflict")
    assert error["resolved_by"] == winner
    assert responses[0 if winner == "alice" else 1].json()["thread_id"] == thread_id
    later = alice.request("POST", path, json={"payload": {"approved": False}})
    assert assert_error(later, 409, "conflict")["resolved_by"] == winner
    snapshot = alice.wait_run(thread_id)
    text = "".join(p.get("text", "") for p in snapshot["messages"][-1]["parts"])
    assert "bob@example.com" not in text


def test_stop_waiting_run_cancels_pending_actions(alice: Api) -> None:
    thread_id, _, snapshot = _pending_email(alice)
    run_id = snapshot["run"]["id"]
    response = alice.request("POST", f"/v1/threads/{thread_id}/runs/{run_id}/stop")
    assert response.status_code == 202, response.text
    assert response.json()["thread_id"] == thread_id
    after = alice.wait_run(thread_id, ("cancelled",))
    assert after["pending_actions"] == []
    states = [p["state"] for m in after["messages"] for p in m["parts"] if p["type"] == "tool-call"]
    assert states == ["cancelled"]
    unknown = alice.request("POST", f"/v1/threads/{thread_id}/runs/run-nope/stop")
    assert_error(unknown, 404, "not_found")


def test_queue_and_cancel_queued_item(alice: Api) -> None:
    thread_id, _, _ = _pending_email(alice)
    queued = alice.send(thread_id, "and then this")
    assert queued.get("queued_item_id") and not queued.get("run_id")
    snapshot = alice.snapshot(thread_id)
    assert [item["id"] for item in snapshot["queue"]] == [queued["queued_item_id"]]
    response = alice.request("DELETE", f"/v1/threads/{thread_id}/queue/{queued['queued_item_id']}")
    assert response.status_code == 200, response.text
    assert response.json()["version"] > snapshot["thread"]["version"]
    assert alice.snapshot(thread_id)["queue"] == []
    assert_error(
        alice.request("DELETE", f"/v1/threads/{thread_id}/queue/item-nope"), 404, "not_found"
    )


def test_policy_reject_while_run_active(alice: Api) -> None:
    thread_id, _, _ = _pending_email(alice)
    refused = alice.request(
        "POST", f"/v1/threads/{thread_id}/messages", json={"text": "now", "policy": "reject"}
    )
    assert_error(refused, 409, "run_active")


def test_manual_result_requires_trusted_role(api_for: Any) -> None:
    alice, svc = api_for("alice"), api_for("svc")
    thread_id, action, _ = _pending_email(alice)
    path = f"/v1/threads/{thread_id}/actions/{action['id']}/manual-result"
    assert_error(alice.request("POST", path, json={"output": "done"}), 403, "forbidden")
    # A backend actor passes the role check; this action is an approval, not a manual result.
    assert_error(svc.request("POST", path, json={"output": "done"}), 422, "invalid_input")
    client_path = f"/v1/threads/{thread_id}/actions/{action['id']}/client-result"
    assert_error(alice.request("POST", client_path, json={"output": 1}), 422, "invalid_input")
    missing = f"/v1/threads/{thread_id}/actions/act-nope/client-result"
    assert alice.request("POST", missing, json={"output": 1}).status_code in (404, 409)


def test_backend_actor_resumes(api_for: Any) -> None:
    alice, svc = api_for("alice"), api_for("svc")
    thread_id, action, _ = _pending_email(alice)
    response = svc.request(
        "POST",
        f"/v1/threads/{thread_id}/actions/{action['id']}/resume",
        json={"payload": {"approved": False}},
    )
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"thread_id", "version"}
    snapshot = alice.wait_run(thread_id)
    assert snapshot["pending_actions"] == []


def test_regenerate_and_visibility(alice: Api) -> None:
    thread_id = alice.create_thread()["thread"]["id"]
    alice.send(thread_id, "say something")
    first = alice.wait_run(thread_id)
    count = len(first["messages"])
    response = alice.request("POST", f"/v1/threads/{thread_id}/regenerate", json={})
    assert response.status_code == 202, response.text
    regen = response.json()
    assert regen["run_id"] and regen["run_id"] != first["run"]["id"]
    second = alice.wait_run(thread_id)
    assert second["run"]["id"] == regen["run_id"]
    assert len(second["messages"]) == count
    assistant_id = second["messages"][-1]["id"]
    hide = alice.request(
        "POST",
        f"/v1/threads/{thread_id}/messages/{assistant_id}/visibility",
        json={"visibility": "hidden"},
    )
    assert hide.status_code == 200, hide.text
    assert hide.json()["version"] > second["thread"]["version"]
    hidden = alice.snapshot(thread_id)
    assert assistant_id not in [m["id"] for m in hidden["messages"]]
    everything = alice.snapshot(thread_id, include_hidden="true")
    shown = {m["id"]: m["visibility"] for m in everything["messages"]}
    assert shown[assistant_id] == "hidden"
    assert_error(
        alice.request("GET", f"/v1/threads/{thread_id}?include_hidden=maybe"), 422, "invalid_input"
    )
    invalid = alice.request(
        "POST",
        f"/v1/threads/{thread_id}/messages/{assistant_id}/visibility",
        json={"visibility": "secret"},
    )
    assert_error(invalid, 422, "invalid_input")
    unknown = alice.request(
        "POST", f"/v1/threads/{thread_id}/regenerate", json={"message_id": "msg-nope"}
    )
    assert_error(unknown, 404, "not_found")


def test_retry_a_cancelled_run(alice: Api) -> None:
    """`run.retry` over HTTP: a cancelled run starts again as a new run from its input; the old
    run cannot be retried twice, and an active run not at all."""
    thread_id, first_action, snapshot = _pending_email(alice)
    run_id = snapshot["run"]["id"]
    busy = alice.request("POST", f"/v1/threads/{thread_id}/runs/{run_id}/retry", json={})
    assert_error(busy, 409, "conflict")
    stopped = alice.request("POST", f"/v1/threads/{thread_id}/runs/{run_id}/stop")
    assert stopped.status_code == 202, stopped.text
    alice.wait_run(thread_id, ("cancelled",))

    response = alice.request("POST", f"/v1/threads/{thread_id}/runs/{run_id}/retry", json={})
    assert response.status_code == 202, response.text
    new_run = response.json()["run_id"]
    assert new_run != run_id
    after = alice.wait_run(thread_id, ("waiting",))
    assert after["run"]["id"] == new_run
    (action,) = after["pending_actions"]
    assert action["id"] != first_action["id"] and action["tool_name"] == "send_email"
    users = [m for m in after["messages"] if m["role"] == "user"]
    assert len(users) == 1, "the retry reuses the run's input instead of adding a message"
    again = alice.request("POST", f"/v1/threads/{thread_id}/runs/{run_id}/retry", json={})
    assert_error(again, 409, "conflict")
