"""Routed approvals on two gateways (Postgres + Redis): racing deciders, four-eyes on every
transport, the assigned inbox, and the audit chain checked by `threadline audit verify`."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.e2e import cluster, harness
from tests.e2e.approvals_agent import EFFECTS_ENV
from tests.e2e.run_inputs import agui_input, approve
from tests.services import require_postgres, require_redis
from threadline_client import ActionsWatch, ThreadlineClient

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
TIMEOUT = 30.0
T = "/v1/threads"
DECIDERS = [f"u{n}" for n in range(1, 13)]


@dataclass
class Setup:
    cluster: cluster.Cluster
    tokens: dict[str, str]
    effects: Path

    def gateway(self, n: int) -> harness.ServerHandle:
        return self.cluster.gateways[n % 2]

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    @property
    def database_url(self) -> str:
        return self.cluster.env["THREADLINE_DATABASE_URL"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    require_postgres()
    require_redis()
    effects = tmp_path_factory.mktemp("approvals") / "effects"
    effects.touch()
    extra = {
        "PYTHONPATH": str(harness.ROOT),
        "THREADLINE_AGENT": "tests.e2e.approvals_agent:agent",
        "THREADLINE_DEMO_DELAY_MS": "0",
        EFFECTS_ENV: str(effects),
    }
    with cluster.cluster(["gateway", "gateway", "worker"], extra=extra) as running:
        specs: dict[str, cluster.TokenSpec] = {
            "alice": ("alpha", "user", "alice", "Alice Requester"),
            "svc": ("alpha", "backend", "svc"),
            "gamma": ("gamma", "user", "gamma-alice"),
            "gamma_svc": ("gamma", "backend", "gamma-svc"),
        }
        for name in DECIDERS:
            specs[name] = ("alpha", "user", name, f"User {name[1:]}")
            specs[f"g_{name}"] = ("gamma", "user", f"gamma-{name}")
        yield Setup(running, running.tokens(specs), effects)
        for process in running.processes:
            assert process.alive(), f"{process.role} died\n{running.logs()}"


async def http(setup: Setup, who: str, method: str, path: str, gateway: int = 0, **kw: Any) -> Any:
    async with httpx.AsyncClient(
        base_url=setup.gateway(gateway).url, headers=setup.headers(who), timeout=TIMEOUT
    ) as client:
        return await client.request(method, path, **kw)


async def waiting_action(setup: Setup, who: str = "alice") -> tuple[str, dict[str, Any]]:
    """A new thread of `who` whose run waits on a routed send_email: (thread id, the action)."""
    created = await http(setup, who, "POST", T, json={})
    thread_id = str(created.json()["thread"]["id"])
    sent = await http(
        setup, who, "POST", f"{T}/{thread_id}/messages", json={"text": "email d@x.io"}
    )
    assert sent.status_code == 202, sent.text
    for _ in range(300):  # bounded: the demo agent suspends in well under a second
        snap = (await http(setup, who, "GET", f"{T}/{thread_id}")).json()
        if snap["run"]["status"] == "waiting" and snap["pending_actions"]:
            return thread_id, snap["pending_actions"][0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run of {thread_id} never waited: {snap}")


async def settled(setup: Setup, thread_id: str, who: str = "svc") -> dict[str, Any]:
    for _ in range(300):
        snap: dict[str, Any] = (await http(setup, who, "GET", f"{T}/{thread_id}")).json()
        if snap["run"]["status"] in ("completed", "failed", "cancelled"):
            return snap
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run of {thread_id} never ended: {snap}")


async def ws_open(setup: Setup, who: str, gateway: int) -> ClientConnection:
    url = f"{setup.gateway(gateway).ws_url}?token={setup.tokens[who]}"
    return await connect(url, open_timeout=TIMEOUT, close_timeout=2)


async def ws_request(socket: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a frame with a fresh id; the `ack`/`error` (or other reply) carrying that id."""
    frame_id = uuid.uuid4().hex
    await socket.send(orjson.dumps({**frame, "id": frame_id}).decode())
    async with asyncio.timeout(TIMEOUT):
        while True:
            reply: dict[str, Any] = orjson.loads(await socket.recv())
            if reply.get("id") == frame_id:
                return reply


def resume_frame(thread_id: str, action_id: str, approved: bool) -> dict[str, Any]:
    return {
        "type": "action.resume",
        "thread_id": thread_id,
        "action_id": action_id,
        "payload": {"approved": approved},
    }


async def decide_all(
    setup: Setup, thread_id: str, action_id: str, votes: dict[str, bool]
) -> dict[str, str]:
    """Every decider of `votes` decides at once, alternating gateways and transports (HTTP,
    websocket): who -> "ok" or the error code."""
    sockets = {who: await ws_open(setup, who, n) for n, who in enumerate(votes) if n % 4 in (2, 3)}
    path = f"{T}/{thread_id}/actions/{action_id}/resume"
    clients = {
        who: httpx.AsyncClient(
            base_url=setup.gateway(n).url, headers=setup.headers(who), timeout=TIMEOUT
        )
        for n, who in enumerate(votes)
        if who not in sockets
    }
    start = asyncio.Event()

    async def one(who: str, approved: bool) -> str:
        await start.wait()
        if who in sockets:
            reply = await ws_request(sockets[who], resume_frame(thread_id, action_id, approved))
            return "ok" if reply["type"] == "ack" else str(reply["code"])
        response = await clients[who].post(path, json={"payload": {"approved": approved}})
        return "ok" if response.status_code == 200 else str(response.json()["error"]["code"])

    tasks = {who: asyncio.create_task(one(who, approved)) for who, approved in votes.items()}
    try:
        await asyncio.sleep(0.05)
        start.set()
        return {who: await task for who, task in tasks.items()}
    finally:
        for socket in sockets.values():
            await socket.close()
        for client in clients.values():
            await client.aclose()


async def audit_of(setup: Setup, thread_id: str, who: str = "svc") -> list[dict[str, Any]]:
    response = await http(setup, who, "GET", "/v1/audit", params={"thread": thread_id})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["entries"]
    return entries


async def decision_rows(setup: Setup, thread_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(setup.database_url)
    try:
        rows: list[asyncpg.Record] = await conn.fetch(
            "SELECT subject, approved FROM action_decisions WHERE thread_id = $1", thread_id
        )
        return rows
    finally:
        await conn.close()


def ran(setup: Setup, tool_call_id: str) -> int:
    return setup.effects.read_text().splitlines().count(tool_call_id)


async def test_twelve_deciders_of_a_quorum_of_two_make_two_decisions_and_one_run(
    setup: Setup,
) -> None:
    thread_id, action = await waiting_action(setup)
    outcomes = await decide_all(setup, thread_id, action["id"], dict.fromkeys(DECIDERS, True))
    counts = Counter(outcomes.values())
    assert counts["ok"] == 2 and counts["conflict"] == 10, outcomes
    snap = await settled(setup, thread_id)
    assert snap["run"]["status"] == "completed" and not snap["pending_actions"]
    assert ran(setup, action["tool_call_id"]) == 1
    winners = sorted(who for who, outcome in outcomes.items() if outcome == "ok")
    rows = await decision_rows(setup, thread_id)
    assert sorted(r["subject"] for r in rows) == winners and all(r["approved"] for r in rows)
    entries = await audit_of(setup, thread_id)
    assert sorted(e["subject"] for e in entries) == winners
    # One transition: only the decision that met the quorum resolved the action.
    assert [e["detail"].endswith("; resolved") for e in entries] == [False, True]
    for entry in entries:
        assert entry["display_name"] == f"User {entry['subject'][1:]}"
        assert entry["transport"] in ("http", "websocket") and entry["token_id"]
        assert entry["client_address"] == "127.0.0.1" and entry["user_agent"]
        assert len(entry["payload_hash"]) == 64 and entry["event"] == "action.approved"


async def test_denials_racing_approvals_end_in_exactly_one_outcome(setup: Setup) -> None:
    thread_id, action = await waiting_action(setup)
    votes = {who: n % 2 == 0 for n, who in enumerate(DECIDERS)}
    outcomes = await decide_all(setup, thread_id, action["id"], votes)
    decided = [who for who, outcome in outcomes.items() if outcome == "ok"]
    assert set(outcomes.values()) <= {"ok", "conflict"}, outcomes
    snap = await settled(setup, thread_id)
    [part] = [
        p
        for m in snap["messages"]
        for p in m["parts"]
        if p.get("tool_call_id") == action["tool_call_id"]
    ]
    rows = await decision_rows(setup, thread_id)
    entries = await audit_of(setup, thread_id)
    assert (
        sorted(r["subject"] for r in rows)
        == sorted(decided)
        == sorted(e["subject"] for e in entries)
    )
    assert sum(e["detail"].endswith("; resolved") for e in entries) == 1
    approvals = [who for who in decided if votes[who]]
    if part["state"] == "rejected":
        # A denial ended it: no more than one approval came first, the tool never ran.
        assert len(approvals) <= 1 and len(decided) == len(approvals) + 1
        assert not votes[entries[-1]["subject"]] and ran(setup, action["tool_call_id"]) == 0
    else:
        assert part["state"] == "output-available" and sorted(approvals) == sorted(decided)
        assert len(decided) == 2 and ran(setup, action["tool_call_id"]) == 1


def agui_body(thread_id: str, action_id: str) -> dict[str, Any]:
    return agui_input(thread_id, run_id=uuid.uuid4().hex, resume=approve(action_id))


def aisdk_body(thread_id: str, action: dict[str, Any]) -> dict[str, Any]:
    part = {
        "type": "tool-send_email",
        "toolCallId": action["tool_call_id"],
        "state": "approval-responded",
        "input": action["input"],
        "approval": {"id": action["id"], "approved": True},
    }
    message = {"id": uuid.uuid4().hex, "role": "assistant", "parts": [part]}
    return {"id": thread_id, "trigger": "submit-message", "messages": [message]}


async def stream(setup: Setup, who: str, path: str, body: Any, gateway: int) -> tuple[int, str]:
    """POST an event-stream route: (status, the first error code in its body or events, or '')."""
    response = await http(setup, who, "POST", path, gateway, json=body)
    text = response.text
    if response.status_code != 200:
        return response.status_code, str(response.json()["error"]["code"])
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            event = orjson.loads(line[5:])
            code = event.get("code") or (event.get("error") or {}).get("code")
            if event.get("type") in ("RUN_ERROR", "error"):
                return 200, str(code or event.get("errorText") or event.get("message"))
    return 200, ""


async def test_the_requester_is_refused_on_every_transport_and_nothing_changes(
    setup: Setup,
) -> None:
    thread_id, action = await waiting_action(setup)
    before = (await http(setup, "alice", "GET", f"{T}/{thread_id}")).json()
    assert before["permissions"]["decide"][action["id"]] == {
        "allowed": False,
        "reason": "requester_excluded",
    }
    path = f"{T}/{thread_id}/actions/{action['id']}/resume"
    refused = await http(setup, "alice", "POST", path, json={"payload": {"approved": True}})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "requester_excluded"
    socket = await ws_open(setup, "alice", 1)
    try:
        reply = await ws_request(socket, resume_frame(thread_id, action["id"], True))
    finally:
        await socket.close()
    assert reply["type"] == "error" and reply["code"] == "requester_excluded", reply
    agui = await stream(setup, "alice", "/v1/ag-ui", agui_body(thread_id, action["id"]), 0)
    aisdk = await stream(setup, "alice", "/v1/ai-sdk/chat", aisdk_body(thread_id, action), 1)
    assert agui == (403, "requester_excluded") or agui[1] == "requester_excluded", agui
    assert aisdk == (403, "requester_excluded") or aisdk[1] == "requester_excluded", aisdk
    after = (await http(setup, "alice", "GET", f"{T}/{thread_id}")).json()
    assert after["thread"]["version"] == before["thread"]["version"]
    assert after["pending_actions"] == before["pending_actions"]
    assert await decision_rows(setup, thread_id) == [] and await audit_of(setup, thread_id) == []
    # The same requests of two others go through (the refusal above was the requester's).
    assert await stream(setup, "u1", "/v1/ag-ui", agui_body(thread_id, action["id"]), 0) == (
        200,
        "",
    )
    assert await stream(setup, "u2", "/v1/ai-sdk/chat", aisdk_body(thread_id, action), 1) == (
        200,
        "",
    )
    snap = await settled(setup, thread_id)
    assert snap["run"]["status"] == "completed" and ran(setup, action["tool_call_id"]) == 1
    assert [e["transport"] for e in await audit_of(setup, thread_id)] == ["ag-ui", "ai-sdk"]


async def inbox(setup: Setup, who: str, gateway: int = 0) -> dict[str, dict[str, Any]]:
    response = await http(setup, who, "GET", "/v1/actions", gateway, params={"assigned": "me"})
    assert response.status_code == 200, response.text
    return {a["id"]: a for a in response.json()["actions"]}


async def until(condition: Any, what: str) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(what)


async def test_the_assigned_inbox_lists_who_may_decide_now_and_a_decision_leaves_it(
    setup: Setup,
) -> None:
    thread_id, action = await waiting_action(setup)
    action_id = action["id"]
    assert action_id not in await inbox(setup, "alice")  # four-eyes: the requester
    assert action_id in await inbox(setup, "u3", 1) and action_id in await inbox(setup, "u4")
    bad = await http(setup, "u3", "GET", "/v1/actions", params={"assigned": "you"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_input"
    watches = {
        who: ThreadlineClient(setup.gateway(n).url, setup.tokens[who])
        for n, who in enumerate(("u3", "u4", "alice"))
    }
    views: dict[str, ActionsWatch] = {}
    try:
        for who, client in watches.items():
            views[who] = await client.watch_actions(assigned="me").__aenter__()
        await until(lambda: all(v.syncs for v in views.values()), "the watches never synced")
        assert action_id in views["u3"].actions and action_id in views["u4"].actions
        assert action_id not in views["alice"].actions
        path = f"{T}/{thread_id}/actions/{action_id}/resume"
        first = await http(setup, "u3", "POST", path, 1, json={"payload": {"approved": True}})
        assert first.status_code == 200, first.text
        # u3 decided: the action leaves u3's inbox; u4's shows the progress.
        await until(lambda: action_id not in views["u3"].actions, "u3's inbox still holds it")

        def progressed() -> bool:
            held = views["u4"].actions.get(action_id)
            return held is not None and held.approval is not None and held.approval.approvals == 1

        await until(progressed, "u4's inbox never showed 1 of 2")
        assert action_id not in await inbox(setup, "u3")
        listed = (await inbox(setup, "u4", 1))[action_id]
        assert listed["approval"]["decisions"][0]["display_name"] == "User 3"
        second = await http(setup, "u4", "POST", path, 0, json={"payload": {"approved": True}})
        assert second.status_code == 200, second.text
        await until(lambda: action_id not in views["u4"].actions, "u4's inbox still holds it")
        assert action_id not in views["alice"].actions and action_id not in views["u3"].actions
    finally:
        for view in views.values():
            await view.__aexit__(None, None, None)
        for client in watches.values():
            await client.aclose()
    await settled(setup, thread_id)


async def test_audit_reads_are_for_trusted_roles_of_the_scope(setup: Setup) -> None:
    thread_id, _ = await waiting_action(setup)
    as_user = await http(setup, "u1", "GET", "/v1/audit", params={"thread": thread_id})
    assert as_user.status_code == 403 and as_user.json()["error"]["code"] == "forbidden"
    foreign = await http(setup, "gamma_svc", "GET", "/v1/audit", params={"thread": thread_id})
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
    other = await http(setup, "gamma_svc", "GET", "/v1/audit", params={"scope": "alpha"})
    assert other.status_code == 404
    both = await http(setup, "svc", "GET", "/v1/audit", params={"scope": "alpha", "thread": "x"})
    assert both.status_code == 422
    stray = await http(setup, "svc", "GET", "/v1/audit", params={"thred": thread_id})
    assert stray.status_code == 422
    paged = await http(setup, "svc", "GET", "/v1/audit", params={"scope": "alpha", "limit": 1})
    body = paged.json()
    assert len(body["entries"]) == 1 and body["next_cursor"] == body["entries"][0]["seq"]
    # Stop the run: its action leaves no pending state behind for later tests.
    run_id = (await http(setup, "alice", "GET", f"{T}/{thread_id}")).json()["run"]["id"]
    await http(setup, "alice", "POST", f"{T}/{thread_id}/runs/{run_id}/stop")


def verify_chain(setup: Setup, scope: str) -> Any:
    return harness.run_command(["audit", "verify", "--scope", scope], setup.cluster.env)


async def tamper(setup: Setup, sql: str, *args: Any) -> str:
    """Run one statement on the database behind the server's back; the subject entry 3 had."""
    conn = await asyncpg.connect(setup.database_url)
    try:
        before = await conn.fetchval(
            "SELECT subject FROM audit_log WHERE scope = 'gamma' AND seq = 3"
        )
        await conn.execute(sql, *args)
        return str(before)
    finally:
        await conn.close()


async def test_audit_verify_holds_then_names_an_edited_or_deleted_entry(setup: Setup) -> None:
    deciders = itertools.cycle([f"g_{who}" for who in DECIDERS])
    for approved in (True, False, True):
        thread_id, action = await waiting_action(setup, "gamma")
        path = f"{T}/{thread_id}/actions/{action['id']}/resume"
        for _ in range(2 if approved else 1):
            who = next(deciders)
            done = await http(setup, who, "POST", path, json={"payload": {"approved": approved}})
            assert done.status_code == 200, done.text
        await settled(setup, thread_id, "gamma_svc")
    intact = verify_chain(setup, "gamma")
    assert intact.returncode == 0, intact.stderr
    assert intact.stdout.strip() == "audit chain of scope gamma: 5 entries, intact"
    # Editing the third decision's row: its own hash no longer matches.
    edit = "UPDATE audit_log SET subject = $1 WHERE scope = 'gamma' AND seq = 3"
    original = await tamper(setup, edit, "mallory")
    edited = verify_chain(setup, "gamma")
    assert edited.returncode == 1 and "entry 3: its content does not match" in edited.stderr
    await tamper(setup, edit, original)
    assert verify_chain(setup, "gamma").returncode == 0  # restored, it holds again
    await tamper(setup, "DELETE FROM audit_log WHERE scope = 'gamma' AND seq = 2")
    deleted = verify_chain(setup, "gamma")
    assert deleted.returncode == 1 and "entry 2: it is missing" in deleted.stderr
    # Another scope's chain is untouched by any of it.
    assert verify_chain(setup, "alpha").returncode == 0
