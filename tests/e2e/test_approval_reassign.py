"""Reassigning an approval on two gateways (Postgres + Redis), under a policy set by
THREADLINE_APPROVAL_POLICIES: over HTTP (async and sync clients) and the websocket, each move
audited, the assigned inbox re-routed live, refusals answered with a code and nothing changed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.e2e import cluster, harness
from tests.e2e.approvals_agent import EFFECTS_ENV
from tests.e2e.test_approval_routing import until, ws_request
from threadline_client import ActionsWatch, Forbidden, SyncThreadlineClient, ThreadlineClient

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
T = "/v1/threads"
POLICIES = {
    "send_email": {
        "subjects": ["bob"],
        "delegation": True,
        "exclude_requester": True,
        "deadline": 3600,
    },
}


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[cluster.Cluster, dict[str, str]]]:
    effects = tmp_path_factory.mktemp("reassign") / "effects"
    effects.touch()
    extra = {
        "PYTHONPATH": str(harness.ROOT),
        "THREADLINE_AGENT": "tests.e2e.approvals_agent:agent",
        "THREADLINE_DEMO_DELAY_MS": "0",
        "THREADLINE_APPROVAL_POLICIES": orjson.dumps(POLICIES).decode(),
        EFFECTS_ENV: str(effects),
    }
    with cluster.cluster(["gateway", "gateway", "worker"], extra=extra) as run:
        specs: dict[str, cluster.TokenSpec] = {
            who: ("alpha", "user", who, who.title()) for who in ("alice", "bob", "carol", "dave")
        }
        specs["svc"] = ("alpha", "backend", "svc")
        tokens = run.tokens(specs)
        yield run, tokens


async def test_a_decider_hands_the_action_on_and_the_inbox_follows(
    running: tuple[cluster.Cluster, dict[str, str]],
) -> None:
    run, tokens = running
    first, second = run.gateways
    clients = {
        who: ThreadlineClient((first if n % 2 else second).url, tokens[who])
        for n, who in enumerate(tokens)
    }
    views: dict[str, ActionsWatch] = {}
    try:
        thread = await clients["alice"].create_thread()
        thread_id = thread.thread.id
        await clients["alice"].send(thread_id, "email d@x.io")

        async def pending() -> dict[str, Any] | None:
            snap = await clients["svc"].request("GET", f"{T}/{thread_id}")
            actions: list[dict[str, Any]] = snap["pending_actions"]
            return actions[0] if actions else None

        action: dict[str, Any] | None = None
        for _ in range(400):
            action = await pending()
            if action is not None:
                break
            await asyncio.sleep(0.025)
        assert action is not None
        action_id = action["id"]
        # The deployment's policy, not the declared quorum-2 one.
        assert action["approval"]["policy"]["subjects"] == ["bob"]
        assert action["approval"]["policy"]["quorum"] == 1
        assert action["approval"]["waiting_for"] == "bob"
        assert action["approval"]["due_at"] is not None

        for who in ("bob", "carol", "dave"):
            views[who] = await clients[who].watch_actions(assigned="me").__aenter__()
        await until(lambda: all(v.syncs for v in views.values()), "the watches never synced")
        assert action_id in views["bob"].actions and action_id not in views["carol"].actions

        # Refused: the requester (four-eyes), a non-decider; nothing changes.
        with pytest.raises(Forbidden) as four_eyes:
            await clients["alice"].reassign(action_id, to_subject="alice", thread_id=thread_id)
        assert four_eyes.value.code == "requester_excluded"
        with pytest.raises(Forbidden) as outsider:
            await clients["carol"].reassign(action_id, to_subject="carol", thread_id=thread_id)
        assert outsider.value.code == "not_a_decider"
        async with httpx.AsyncClient(
            base_url=first.url, headers={"Authorization": f"Bearer {tokens['bob']}"}
        ) as bob_http:
            path = f"{T}/{thread_id}/actions/{action_id}/reassign"
            both = await bob_http.post(path, json={"to_subject": "c", "to_group": "g"})
            assert both.status_code == 422 and both.json()["error"]["code"] == "invalid_input"

        # Bob (async client, HTTP) hands it to carol: it leaves his inbox and reaches hers.
        await clients["bob"].reassign(action_id, to_subject="carol", thread_id=thread_id)
        await until(lambda: action_id in views["carol"].actions, "carol's inbox never got it")
        await until(lambda: action_id not in views["bob"].actions, "bob's inbox still holds it")
        held = views["carol"].actions[action_id].approval
        assert held is not None and held.waiting_for == "carol"
        assert held.assigned is not None and held.assigned.subjects == ("carol",)

        # Carol (websocket) hands it to dave.
        async with connect(f"{second.ws_url}?token={tokens['carol']}") as ws:
            frame = {
                "type": "action.reassign",
                "thread_id": thread_id,
                "action_id": action_id,
                "to_subject": "dave",
            }
            reply = await ws_request(ws, frame)
            assert reply["type"] == "ack", reply
            again = await ws_request(ws, frame)  # carol is no decider any more
            assert (again["type"], again["code"]) == ("error", "not_a_decider"), again
        await until(lambda: action_id in views["dave"].actions, "dave's inbox never got it")
        await until(lambda: action_id not in views["carol"].actions, "carol still holds it")

        # Dave (sync client) hands it back to bob, who approves.
        def dave_hands_back() -> None:
            with SyncThreadlineClient(first.url, tokens["dave"]) as sync:
                sync.reassign(action_id, to_subject="bob", thread_id=thread_id)

        await asyncio.to_thread(dave_hands_back)
        await until(lambda: action_id in views["bob"].actions, "bob's inbox never got it back")
        await clients["bob"].resume(action_id, {"approved": True}, thread_id=thread_id)
        await until(lambda: action_id not in views["bob"].actions, "bob still holds it")
        audit = await clients["svc"].request("GET", "/v1/audit", params={"thread": thread_id})
        moves = [(e["event"], e["subject"], e["transport"]) for e in audit["entries"]]
        assert moves == [
            ("action.reassigned", "bob", "http"),
            ("action.reassigned", "carol", "websocket"),
            ("action.reassigned", "dave", "http"),
            ("action.approved", "bob", "http"),
        ]
        details = [e["detail"] for e in audit["entries"][:3]]
        assert details == ["stage 0: to carol", "stage 0: to dave", "stage 0: to bob"]
    finally:
        for view in views.values():
            await view.__aexit__(None, None, None)
        for client in clients.values():
            await client.aclose()
    verified = await asyncio.to_thread(
        harness.run_command, ["audit", "verify", "--scope", "alpha"], run.env
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
