"""The authorization hook on a real server: a deployment whose hook (tests/e2e/authz_hook.py)
lets a user see only threads they own or whose `group` metadata names their group. Every
command on every transport obeys it (list, snapshot, subscribe, send, resume, inbox), and a
refusal changes nothing: the committed state read by an admin is equal before and after."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.e2e import harness
from tests.e2e.run_inputs import agui_input

T = "/v1/threads"
POLICY = "forbidden_by_policy"


@dataclass
class Deployment:
    server: harness.ServerHandle
    tokens: dict[str, str]
    mine: str  # alice's, no group: alice only; its run waits on an approval
    shared: str  # alice's, group finance: alice, bob and carol
    bobs: str  # bob's, no group: bob only
    action: str  # the pending action of `mine`

    def http(self, who: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.request(method, self.server.url + path, headers=headers, timeout=20, **kwargs)

    def ok(self, who: str, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http(who, method, path, **kwargs)
        assert response.status_code in (200, 201, 202), response.text
        return response.json()

    def socket(self, who: str) -> ClientConnection:
        return connect(f"{self.server.ws_url}?token={self.tokens[who]}", open_timeout=20)

    def committed(self) -> dict[str, Any]:
        """Every thread of the scope as the admin sees it (the hook allows admins all)."""
        listing = self.ok("admin", "GET", T)
        return {
            t["id"]: self.ok("admin", "GET", f"{T}/{t['id']}?include_hidden=true")
            for t in listing["threads"]
        }


def frame_answer(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send `frame` with a fresh id; its answer (an error frame or the command's reply)."""
    frame_id = uuid.uuid4().hex
    ws.send(json.dumps({"id": frame_id, **frame}))
    for _ in range(100):
        answer: dict[str, Any] = json.loads(ws.recv(timeout=20))
        if answer.get("id") == frame_id:
            return answer
    raise AssertionError(f"no answer to {frame}")


def stream_refusal(response: httpx.Response) -> str:
    """The code a streaming route refused with: a JSON error before the stream, or RUN_ERROR
    / an `error` part inside it ("" when it did not refuse)."""
    if response.status_code != 200:
        assert response.status_code == 403, response.text
        return str(response.json()["error"]["code"])
    for line in response.text.splitlines():
        if line.startswith("data:") and ('"RUN_ERROR"' in line or '"type":"error"' in line):
            event = json.loads(line[5:])
            return str(event.get("code") or event.get("errorText", ""))
    return ""


def chat(chat_id: str, text: str = "hi") -> dict[str, Any]:
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat_id, "trigger": "submit-message", "messages": [message]}


def wait_pending(d: Deployment, thread_id: str) -> str:
    for _ in range(300):
        snapshot = d.ok("alice", "GET", f"{T}/{thread_id}")
        if snapshot["pending_actions"]:
            return str(snapshot["pending_actions"][0]["id"])
        time.sleep(0.05)
    raise AssertionError(f"no pending action on {thread_id}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    directory = tmp_path_factory.mktemp("authorization")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {"THREADLINE_AUTHORIZE": "tests.e2e.authz_hook:authorize"},
    )
    with harness.start(env=env, log_dir=directory) as server:
        tokens = {
            name: server.token("alpha", role, name)
            for name, role in (("alice", "user"), ("bob", "user"), ("carol", "user"))
        }
        tokens["admin"] = server.token("alpha", "admin", "root")
        tokens["svc"] = server.token("alpha", "backend", "svc")
        d = Deployment(server, tokens, "", "", "", "")
        d.mine = d.ok("alice", "POST", T, json={"title": "mine"})["thread"]["id"]
        shared = {"title": "shared", "metadata": {"group": "finance"}}
        d.shared = d.ok("alice", "POST", T, json=shared)["thread"]["id"]
        d.bobs = d.ok("bob", "POST", T, json={"title": "bob's"})["thread"]["id"]
        d.ok("alice", "POST", f"{T}/{d.mine}/messages", json={"text": "email x@example.com"})
        d.action = wait_pending(d, d.mine)
        yield d


def test_threads_record_their_owner(deployment: Deployment) -> None:
    d = deployment
    assert d.ok("admin", "GET", f"{T}/{d.mine}")["thread"]["owner"] == "alice"
    assert d.ok("admin", "GET", f"{T}/{d.bobs}")["thread"]["owner"] == "bob"
    owners = {t["id"]: t["owner"] for t in d.ok("admin", "GET", T)["threads"]}
    assert owners == {d.mine: "alice", d.shared: "alice", d.bobs: "bob"}


def test_lists_are_narrowed_by_the_store_with_exact_pages(deployment: Deployment) -> None:
    d = deployment
    seen = {who: {t["id"] for t in d.ok(who, "GET", T)["threads"]} for who in ("alice", "bob")}
    assert seen == {"alice": {d.mine, d.shared}, "bob": {d.shared, d.bobs}}
    assert {t["id"] for t in d.ok("carol", "GET", T)["threads"]} == {d.shared}
    # Pages of one: every page full until the last, no thread twice, none of alice's own.
    paged: list[str] = []
    cursor = ""
    for _ in range(5):
        page = d.ok("bob", "GET", f"{T}?limit=1" + (f"&cursor={cursor}" if cursor else ""))
        paged += [t["id"] for t in page["threads"]]
        cursor = page["next_cursor"] or ""
        if not cursor:
            break
    assert sorted(paged) == sorted([d.shared, d.bobs]) and len(paged) == 2
    # The inbox: alice's waiting thread is in her inbox, not in bob's.
    assert d.action in {a["id"] for a in d.ok("alice", "GET", "/v1/actions")["actions"]}
    assert d.ok("bob", "GET", "/v1/actions")["actions"] == []
    assert d.action in {a["id"] for a in d.ok("svc", "GET", "/v1/actions")["actions"]}


def test_every_transport_refuses_what_the_hook_denies_and_changes_nothing(
    deployment: Deployment,
) -> None:
    d = deployment
    before = d.committed()
    resume = {"payload": {"approved": True}}
    # HTTP: read, send, resume, rename, metadata, queue, stop.
    run_id = before[d.mine]["run"]["id"]
    for method, path, body in [
        ("GET", f"{T}/{d.mine}", None),
        ("POST", f"{T}/{d.mine}/messages", {"text": "hi"}),
        ("POST", f"{T}/{d.mine}/actions/{d.action}/resume", resume),
        ("PATCH", f"{T}/{d.mine}", {"title": "taken"}),
        ("PATCH", f"{T}/{d.mine}/metadata", {"metadata": {"group": "finance"}}),
        ("POST", f"{T}/{d.mine}/runs/{run_id}/stop", None),
        ("POST", f"{T}/{d.mine}/regenerate", {}),
    ]:
        response = d.http("bob", method, path, json=body)
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"]["code"] == POLICY, response.text
    # Websocket: subscribe, send, resume.
    with d.socket("bob") as ws:
        frames: list[dict[str, Any]] = [
            {"type": "subscribe", "thread_id": d.mine},
            {"type": "message.send", "thread_id": d.mine, "text": "hi"},
            {"type": "action.resume", "thread_id": d.mine, "action_id": d.action, **resume},
        ]
        for frame in frames:
            answer = frame_answer(ws, frame)
            assert (answer["type"], answer.get("code")) == ("error", POLICY), (frame, answer)
        # The same socket may watch what the hook lets bob see.
        assert (
            frame_answer(ws, {"type": "subscribe", "thread_id": d.shared})["type"] == "subscribed"
        )
    # AG-UI: a message, and a resume of alice's pending action, on her thread's id.
    interrupt = [{"interruptId": d.action, "status": "resolved", "payload": {"approved": True}}]
    for body in (agui_input(d.mine, "hi"), agui_input(d.mine, resume=interrupt)):
        assert stream_refusal(d.http("bob", "POST", "/v1/ag-ui", json=body)) == POLICY
    # AI SDK: a message, an approval of alice's action, and the resumable stream of the thread.
    assert stream_refusal(d.http("bob", "POST", "/v1/ai-sdk/chat", json=chat(d.mine))) == POLICY
    approval = {
        "type": "tool-send_email",
        "toolCallId": before[d.mine]["pending_actions"][0]["tool_call_id"],
        "state": "approval-responded",
        "approval": {"id": d.action, "approved": True},
    }
    answer = {"id": uuid.uuid4().hex, "role": "assistant", "parts": [approval]}
    responded: dict[str, Any] = {"id": d.mine, "trigger": "submit-message", "messages": [answer]}
    assert stream_refusal(d.http("bob", "POST", "/v1/ai-sdk/chat", json=responded)) == POLICY
    stream = d.http("bob", "GET", f"/v1/ai-sdk/chat/{d.mine}/stream")
    assert stream_refusal(stream) == POLICY
    assert d.committed() == before


def test_a_deny_with_its_own_code_holds_on_every_transport(deployment: Deployment) -> None:
    """Carol may read the finance thread but not write to it: the hook's `Deny` for writes,
    asked for each step of an event-stream request after the thread was opened for reading."""
    d = deployment
    before = d.committed()
    assert d.ok("carol", "GET", f"{T}/{d.shared}")["thread"]["id"] == d.shared
    response = d.http("carol", "POST", f"{T}/{d.shared}/messages", json={"text": "hi"})
    assert (response.status_code, response.json()["error"]["code"]) == (403, "read_only")
    created = d.http("carol", "POST", T, json={"title": "x"})
    assert (created.status_code, created.json()["error"]["code"]) == (403, "read_only")
    with d.socket("carol") as ws:
        answer = frame_answer(ws, {"type": "message.send", "thread_id": d.shared, "text": "hi"})
        assert (answer["type"], answer.get("code")) == ("error", "read_only"), answer
        subscribed = frame_answer(ws, {"type": "subscribe", "thread_id": d.shared})
        assert subscribed["type"] == "subscribed"
    assert stream_refusal(
        d.http("carol", "POST", "/v1/ag-ui", json=agui_input(d.shared, "hi"))
    ) == ("read_only")
    assert stream_refusal(d.http("carol", "POST", "/v1/ai-sdk/chat", json=chat(d.shared))) == (
        "read_only"
    )
    assert d.committed() == before


def test_what_the_hook_allows_works_on_every_transport(deployment: Deployment) -> None:
    d = deployment
    # Bob reads the finance thread, and watches it.
    assert d.ok("bob", "GET", f"{T}/{d.shared}")["thread"]["owner"] == "alice"
    # A thread bob opens over AG-UI is his: created through thread.open, owned by him, hidden
    # from alice; the message sent in the same request ran (the hook saw the thread to be).
    client_id = f"bob-{uuid.uuid4().hex[:8]}"
    events = d.http("bob", "POST", "/v1/ag-ui", json=agui_input(client_id, "hello"))
    assert events.status_code == 200 and stream_refusal(events) == "", events.text
    mine = {t["id"]: t for t in d.ok("bob", "GET", T)["threads"]}
    opened = [t for t in mine.values() if t["id"].startswith(client_id)]
    assert len(opened) == 1 and opened[0]["owner"] == "bob"
    assert opened[0]["id"] not in {t["id"] for t in d.ok("alice", "GET", T)["threads"]}
    assert d.http("alice", "GET", f"{T}/{opened[0]['id']}").json()["error"]["code"] == POLICY
    # Alice, the owner, resumes her action over the websocket.
    with d.socket("alice") as ws:
        frame = {"type": "action.resume", "thread_id": d.mine, "action_id": d.action}
        answer = frame_answer(ws, {**frame, "payload": {"approved": False}})
        assert answer["type"] == "ack", answer


def test_the_live_inbox_shows_a_narrowed_caller_only_its_threads(deployment: Deployment) -> None:
    """Bob's live inbox announces the finance thread's action, never alice's own thread's:
    alice's action is announced first (her socket sees it), so bob would see it first."""
    d = deployment
    private = d.ok("alice", "POST", T, json={"title": "private"})["thread"]["id"]
    with d.socket("alice") as alice, d.socket("bob") as bob:
        for ws in (alice, bob):
            assert frame_answer(ws, {"type": "actions.subscribe"})["type"] == "actions.subscribed"
        d.ok("alice", "POST", f"{T}/{private}/messages", json={"text": "email p@example.com"})
        assert next_pending(alice)["thread_id"] == private
        d.ok("alice", "POST", f"{T}/{d.shared}/messages", json={"text": "email s@example.com"})
        assert next_pending(alice)["thread_id"] == d.shared
        assert next_pending(bob)["thread_id"] == d.shared


def next_pending(ws: ClientConnection) -> dict[str, Any]:
    for _ in range(100):
        frame: dict[str, Any] = json.loads(ws.recv(timeout=20))
        if frame["type"] == "action.pending":
            return frame
    raise AssertionError("no action.pending frame")
