"""The schedule and webhook commands over HTTP, the websocket and the Python client: scopes,
roles and validation, each refusal an error body that changes nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.e2e import harness
from tests.e2e.conftest import Api, assert_error
from threadline_client import ThreadlineClient
from threadline_client.exceptions import Forbidden, InvalidInput, NotFound


def schedule_body(thread_id: str, **extra: Any) -> dict[str, Any]:
    return {"thread_id": thread_id, "cron": "0 9 * * *", "text": "digest", **extra}


def test_schedules_are_scoped_and_validated(api_for: Any) -> None:
    alice: Api = api_for("alice")
    carol: Api = api_for("carol")
    thread = alice.create_thread(title="s")["thread"]["id"]
    made = alice.request("POST", "/v1/schedules", json=schedule_body(thread))
    assert made.status_code == 201, made.text
    schedule = made.json()["schedule"]["id"]
    for method, path in (
        ("GET", f"/v1/schedules/{schedule}"),
        ("GET", f"/v1/schedules/{schedule}/fires"),
        ("POST", f"/v1/schedules/{schedule}/pause"),
        ("POST", f"/v1/schedules/{schedule}/resume"),
        ("DELETE", f"/v1/schedules/{schedule}"),
    ):
        assert_error(carol.request(method, path), 404, "not_found")
    assert carol.request("GET", "/v1/schedules").json() == {"schedules": [], "next_cursor": None}
    # Another scope's thread is not found, whatever else the body says.
    assert_error(
        carol.request("POST", "/v1/schedules", json=schedule_body(thread)), 404, "not_found"
    )
    for bad in (
        schedule_body(thread, cron="not cron"),
        schedule_body(thread, timezone="Nowhere/City"),
        schedule_body(thread, cron=None),
        schedule_body(thread, run_at=time.time() + 60),
        schedule_body(thread, missed="sometimes"),
        schedule_body(thread, new_thread=True),
        {**schedule_body(thread), "extra": 1},
    ):
        body = {k: v for k, v in bad.items() if v is not None}
        assert_error(alice.request("POST", "/v1/schedules", json=body), 422, "invalid_input")
    assert len(alice.request("GET", "/v1/schedules").json()["schedules"]) == 1
    fires = alice.request("GET", f"/v1/schedules/{schedule}/fires?limit=1")
    assert fires.json() == {"fires": [], "next_cursor": None}
    for cursor in ("nope", "WzEsMl0", ""):
        for path in (f"/v1/schedules/{schedule}/fires", "/v1/schedules"):
            assert_error(alice.request("GET", f"{path}?cursor={cursor}"), 422, "invalid_input")
    paused = alice.request("POST", f"/v1/schedules/{schedule}/pause").json()["schedule"]
    assert paused["status"] == "paused" and paused["next_fire_at"] is None


def test_webhooks_need_a_trusted_role_and_their_scope(api_for: Any) -> None:
    svc: Api = api_for("svc")
    other: Api = api_for("beta_svc")
    alice: Api = api_for("alice")
    made = svc.request("POST", "/v1/webhooks", json={"url": "https://93.184.215.14/hook"})
    assert made.status_code == 201, made.text
    webhook = made.json()["webhook"]
    assert webhook["secret"].startswith("whsec_") and "message.committed" not in webhook["events"]
    assert_error(
        alice.request("POST", "/v1/webhooks", json={"url": "https://93.184.215.14/"}),
        403,
        "forbidden",
    )
    assert_error(alice.request("GET", "/v1/webhooks"), 403, "forbidden")
    for method, path in (
        ("POST", f"/v1/webhooks/{webhook['id']}"),
        ("DELETE", f"/v1/webhooks/{webhook['id']}"),
        ("GET", f"/v1/webhooks/{webhook['id']}/deliveries"),
    ):
        assert_error(other.request(method, path, json={}), 404, "not_found")
    assert_error(other.request("POST", "/v1/deliveries/msg_x/redeliver"), 404, "not_found")
    assert_error(
        svc.request("GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=lost"),
        422,
        "invalid_input",
    )
    assert_error(
        svc.request("GET", f"/v1/webhooks/{webhook['id']}/deliveries?cursor=nope"),
        422,
        "invalid_input",
    )
    listed = svc.request("GET", "/v1/webhooks").json()["webhooks"]
    assert [w["id"] for w in listed] == [webhook["id"]] and "secret" not in listed[0]
    second = svc.request("POST", "/v1/webhooks", json={"url": "https://93.184.215.14/two"})
    first_page = svc.request("GET", "/v1/webhooks?limit=1").json()
    assert [w["id"] for w in first_page["webhooks"]] == [webhook["id"]]
    rest = svc.request("GET", f"/v1/webhooks?limit=1&cursor={first_page['next_cursor']}").json()
    assert [w["id"] for w in rest["webhooks"]] == [second.json()["webhook"]["id"]]
    assert_error(svc.request("GET", "/v1/webhooks?cursor=nope"), 422, "invalid_input")


async def test_websocket_frames_and_the_client(
    server: harness.ServerHandle, tokens: dict[str, str]
) -> None:
    async with ThreadlineClient(server.url, tokens["alice"]) as alice:
        thread = await alice.create_thread(title="ws")
        schedule = await alice.create_schedule(
            "hello", thread_id=thread.thread.id, cron="*/5 * * * *", timezone="Asia/Tokyo"
        )
        assert schedule.status == "active" and schedule.next_fire_at is not None
        assert [fire async for fire in alice.schedule_fires(schedule.id, page_size=1)] == []
        with pytest.raises(InvalidInput):
            await alice.create_schedule("x", thread_id=thread.thread.id, cron="99 * * * *")
        with pytest.raises(Forbidden):
            await alice.create_webhook("https://93.184.215.14/")
    async with ThreadlineClient(server.url, tokens["carol"]) as carol:
        with pytest.raises(NotFound):
            await carol.pause_schedule(schedule.id)
    async with connect(f"{server.ws_url}?token={tokens['carol']}") as ws:
        for kind in ("schedule.pause", "schedule.resume", "schedule.delete"):
            await ws.send(orjson.dumps({"type": kind, "id": kind, "schedule_id": schedule.id}))
            async with asyncio.timeout(10):
                answer = orjson.loads(await ws.recv())
            assert (answer["type"], answer["code"], answer["id"]) == ("error", "not_found", kind)
    async with connect(f"{server.ws_url}?token={tokens['alice']}") as ws:
        await ws.send(orjson.dumps({"type": "schedule.pause", "id": 1, "schedule_id": schedule.id}))
        async with asyncio.timeout(10):
            answer = orjson.loads(await ws.recv())
        assert (answer["type"], answer["id"]) == ("ack", 1)
        assert answer["schedule"]["status"] == "paused"
    async with ThreadlineClient(server.url, tokens["alice"]) as alice:
        [listed] = [s for s in await alice.list_schedules() if s.id == schedule.id]
        assert listed.status == "paused"
        for _ in range(3):
            await alice.create_schedule("more", thread_id=thread.thread.id, cron="0 0 * * *")
        paged = [s.id async for s in alice.schedules(page_size=2)]
        assert paged == [s.id for s in await alice.list_schedules()] and len(paged) >= 4
        await alice.delete_schedule(schedule.id)
        assert schedule.id not in {s.id for s in await alice.list_schedules()}


def test_the_cli_manages_schedules_and_webhooks(server: harness.ServerHandle, api_for: Any) -> None:
    alice: Api = api_for("alice")
    thread = alice.create_thread(title="cli")["thread"]["id"]

    def cli(*args: str) -> list[dict[str, Any]]:
        done = harness.run_command(list(args), server.env)
        assert done.returncode == 0, done.stderr[-2000:]
        return [orjson.loads(line) for line in done.stdout.splitlines()]

    [made] = cli(
        "schedule",
        "create",
        "--scope",
        "alpha",
        "--thread",
        thread,
        "--cron",
        "30 8 * * 1-5",
        "--timezone",
        "America/New_York",
        "--text",
        "standup",
    )
    assert made["created_by"] == "cli" and made["next_fire_at"] > time.time()
    # What the CLI made, the API sees (one storage, one service).
    listed = alice.request("GET", f"/v1/schedules/{made['id']}").json()["schedule"]
    assert listed["cron"] == "30 8 * * 1-5"
    [paused] = cli("schedule", "pause", "--scope", "alpha", made["id"])
    assert paused["status"] == "paused"
    refused = harness.run_command(["schedule", "pause", "--scope", "beta", made["id"]], server.env)
    assert refused.returncode != 0 and "not_found" in refused.stderr
    loopback = harness.run_command(
        ["webhook", "create", "--scope", "alpha", "--url", "http://127.0.0.1:9/"], server.env
    )
    assert loopback.returncode != 0 and "loopback" in loopback.stderr
    [hook] = cli(
        "webhook",
        "create",
        "--scope",
        "alpha",
        "--url",
        "https://93.184.215.14/h",
        "--event",
        "run.failed",
    )
    assert hook["secret"].startswith("whsec_") and hook["events"] == ["run.failed"]
    cli("webhook", "disable", "--scope", "alpha", hook["id"])
    cli("webhook", "delete", "--scope", "alpha", hook["id"])
    cli("schedule", "delete", "--scope", "alpha", made["id"])
    assert_error(alice.request("GET", f"/v1/schedules/{made['id']}"), 404, "not_found")
