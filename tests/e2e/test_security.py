"""Access control on every route and every client frame type, enumerated from the app itself."""

from __future__ import annotations

import asyncio
import re
import tempfile
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from pydantic import BaseModel
from starlette.routing import Mount, Route, WebSocketRoute
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.app import create_app
from server.protocol.client_frames import CLIENT_FRAME_TYPES, ClientFrame
from server.settings import ServerRole, Settings
from tests.e2e import harness
from tests.e2e.conftest import VALID_BODIES, Api
from tests.e2e.harness import ServerHandle

TIMEOUT = 10.0
PATH_PARAM = re.compile(r"{(\w+)}")
# Never opened: create_app only builds the route table, the lifespan would open storage.
UNUSED_DB = f"sqlite:///{Path(tempfile.gettempdir()) / 'threadline-routes-unused.sqlite3'}"


def app_routes(role: ServerRole = "all") -> list[Any]:
    return list(create_app(Settings(role=role, database_url=UNUSED_DB)).routes)


def api_routes() -> list[tuple[str, str, str]]:
    """(name, method, path) of every authenticated HTTP route of the app."""
    found = []
    for route in app_routes():
        if isinstance(route, Route) and route.path.startswith("/v1/"):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                found.append((route.name, method, route.path))
    return found


def thread_routes() -> list[tuple[str, str, str]]:
    return [r for r in api_routes() if r[2].startswith("/v1/threads/{thread_id}")]


def frame_models() -> list[type[BaseModel]]:
    """The client frame models, read from the discriminated union itself."""
    union, *_ = typing.get_args(ClientFrame)
    return list(typing.get_args(union))


def frame_type(model: type[BaseModel]) -> str:
    (literal,) = typing.get_args(model.model_fields["type"].annotation)
    return str(literal)


# Bodies that are wrong in some way, for routes that read one.
BAD_BODIES: list[Any] = [b"{not json", [1, 2], {"unexpected": 1}, {"text": 7, "payload": "x"}]
SUB_IDS = ("message_id", "action_id", "run_id", "item_id")
HOOK_IDS = ("schedule_id", "webhook_id", "delivery_id")  # routes outside /v1/threads


@dataclass(frozen=True)
class Owned:
    """A thread of scope alpha with one of everything a route can address."""

    thread_id: str
    message_id: str
    action_id: str
    run_id: str
    item_id: str

    def ids(self) -> dict[str, str]:
        return {
            "thread_id": self.thread_id,
            "message_id": self.message_id,
            "action_id": self.action_id,
            "run_id": self.run_id,
            "item_id": self.item_id,
            "token_id": uuid.uuid4().hex[:24],  # the admin token routes' id
            # Schedules, webhooks and deliveries belong to no thread: unknown ids here.
            **{name: f"x-{name}" for name in HOOK_IDS},
        }


def missing_ids() -> dict[str, str]:
    names = ("thread_id", *SUB_IDS, *HOOK_IDS)
    ids = {name: f"x-{uuid.uuid4().hex}" for name in names}
    # token_id: the admin token routes' id (a hash prefix), which names no thread at all.
    return {**ids, "token_id": uuid.uuid4().hex[:24]}


def fill(path: str, ids: dict[str, str]) -> str:
    return PATH_PARAM.sub(lambda m: ids[m.group(1)], path)


def request_kwargs(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if isinstance(body, bytes):
        return {"content": body, "headers": {"content-type": "application/json"}}
    return {"json": body}


def outcome(response: httpx.Response) -> tuple[int, str]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    return response.status_code, response.json()["error"]["code"]


@pytest.fixture(scope="module")
def more_tokens(server: ServerHandle, tokens: dict[str, str]) -> dict[str, str]:
    return {**tokens, "beta_admin": server.token("beta", "admin", "beta-admin")}


@pytest.fixture(scope="module")
def owned(server: ServerHandle, tokens: dict[str, str]) -> Iterator[Owned]:
    alice = Api(server.url, tokens["alice"])
    try:
        thread_id = alice.create_thread(title="secret")["thread"]["id"]
        sent = alice.send(thread_id, "please email bob@example.com the plan")
        waiting = alice.wait_run(thread_id, ("waiting",))
        queued = alice.send(thread_id, "and then this")
        yield Owned(
            thread_id=thread_id,
            message_id=sent["message_id"],
            action_id=waiting["pending_actions"][0]["id"],
            run_id=sent["run_id"],
            item_id=queued["queued_item_id"],
        )
    finally:
        alice.close()


# --- the tables themselves ----------------------------------------------------------------


def test_route_and_frame_tables_are_covered() -> None:
    routes = app_routes()
    others = {(type(r).__name__, r.path) for r in routes if not isinstance(r, Route)}
    # A new kind of endpoint must be added to the checks below before this passes again.
    assert others == {("WebSocketRoute", "/v1/ws"), ("Mount", "/static")}, others
    assert all(isinstance(r, Route | WebSocketRoute | Mount) for r in routes)
    public = {r.path for r in routes if isinstance(r, Route) and not r.path.startswith("/v1/")}
    # Probes, metrics (no ids in any label) and the API description need no token.
    assert public == {"/", "/healthz", "/readyz", "/metrics", "/openapi.json"}, public
    for name, _, path in thread_routes():
        assert name in VALID_BODIES, f"add a valid body for route {name}"
        assert set(PATH_PARAM.findall(path)) <= {"thread_id", *SUB_IDS}, path
    assert {frame_type(m) for m in frame_models()} == set(CLIENT_FRAME_TYPES)
    assert len(api_routes()) >= 12 and len(frame_models()) >= 11


def test_worker_role_serves_only_probes_and_metrics(tmp_path: Path) -> None:
    assert [r.path for r in app_routes("worker")] == ["/healthz", "/readyz", "/metrics"]
    with harness.start("worker", database_url=harness.sqlite_url(tmp_path), log_dir=tmp_path) as w:
        with httpx.Client(base_url=w.url, timeout=TIMEOUT) as client:
            assert client.get("/healthz").json()["role"] == "worker"
            for _, method, path in api_routes():
                response = client.request(method, fill(path, missing_ids()), json={})
                assert outcome(response) == (404, "not_found"), (method, path)

        async def upgrade() -> None:
            with pytest.raises((InvalidStatus, ConnectionClosed)):
                async with connect(w.ws_url, open_timeout=TIMEOUT) as ws:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)

        asyncio.run(upgrade())


# --- HTTP: authentication -------------------------------------------------------------


def bad_authorizations(real: str) -> dict[str, dict[str, str]]:
    tampered = real[:-1] + ("A" if real[-1] != "A" else "B")
    return {
        "empty bearer": {"Authorization": "Bearer"},
        "well-formed unknown": {"Authorization": "Bearer tl_" + "Q" * 43},
        "overlong": {"Authorization": "Bearer tl_" + "a" * 500},
        "tampered": {"Authorization": f"Bearer {tampered}"},
        "token without scheme": {"Authorization": real},
        "non-ascii": {"Authorization": "Bearer tl_\u00e9t\u00e9"},
    }


def test_bad_tokens_are_refused_before_anything_else(
    server: ServerHandle, tokens: dict[str, str], owned: Owned
) -> None:
    """401 with `WWW-Authenticate: Bearer` on every route, whatever the token looks like, for
    existing and missing ids alike, before the body is even read."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        for label, headers in bad_authorizations(tokens["alice"]).items():
            for name, method, path in api_routes():
                for ids in (owned.ids(), missing_ids()):
                    for body in (VALID_BODIES.get(name, {}), b"{not json"):
                        kwargs = request_kwargs(body)
                        kwargs["headers"] = {**kwargs.get("headers", {}), **headers}
                        try:
                            response = client.request(method, fill(path, ids), **kwargs)
                        except UnicodeEncodeError:
                            continue  # httpx refuses to send the header at all
                        assert outcome(response) == (401, "unauthorized"), (label, name)
                        assert response.headers["www-authenticate"] == "Bearer"
                        assert tokens["alice"] not in response.text


# --- HTTP: scope isolation --------------------------------------------------------------


@pytest.mark.parametrize("intruder", ["carol", "beta_svc", "beta_admin"])
def test_other_scopes_cannot_tell_a_thread_exists(
    api_for: Any, more_tokens: dict[str, str], owned: Owned, intruder: str, server: ServerHandle
) -> None:
    """For every route and body, a thread of another scope (addressed with its real message,
    action, run and queue ids) answers exactly like a thread that does not exist; with a valid
    body that answer is 404 not_found (403 for manual results of a user: role comes first)."""
    owner = api_for("alice")
    before = owner.snapshot(owned.thread_id, include_hidden="true")
    other = Api(server.url, more_tokens[intruder])
    try:
        for name, method, path in thread_routes():
            bodies = [VALID_BODIES[name]] + (BAD_BODIES if VALID_BODIES[name] is not None else [])
            for body in bodies:
                absent_ids = missing_ids()
                # The real thread with made-up sub-resources, too: nothing may differ.
                half = {**absent_ids, "thread_id": owned.thread_id}
                answers = [
                    (other.request(method, fill(path, ids), **request_kwargs(body)), ids)
                    for ids in (owned.ids(), absent_ids, half)
                ]
                shapes = [
                    (r.status_code, without_ids(r.json(), {**owned.ids(), **ids}))
                    for r, ids in answers
                ]
                assert shapes[0] == shapes[1] == shapes[2], (name, body, shapes)
                foreign = answers[0][0]
                if body is VALID_BODIES[name]:
                    expected = (404, "not_found")
                    if name == "manual_result" and intruder == "carol":
                        expected = (403, "forbidden")
                    assert outcome(foreign) == expected, (name, foreign.text)
        listed = other.request("GET", "/v1/threads").json()["threads"]
        assert owned.thread_id not in {t["id"] for t in listed}
    finally:
        other.close()
    assert owner.snapshot(owned.thread_id, include_hidden="true") == before


def test_manual_results_need_a_trusted_role_whatever_the_thread(api_for: Any, owned: Owned) -> None:
    """The role check precedes the lookup and the body: a user gets 403 on its own thread, on
    another scope's, on a missing one, with a valid or a broken body."""
    path = next(p for n, _, p in thread_routes() if n == "manual_result")
    for user in ("alice", "bob", "carol"):
        api = api_for(user)
        for ids in (owned.ids(), missing_ids()):
            for body in (VALID_BODIES["manual_result"], *BAD_BODIES):
                response = api.request("POST", fill(path, ids), **request_kwargs(body))
                assert outcome(response) == (403, "forbidden"), (user, body, response.text)
    assert api_for("alice").snapshot(owned.thread_id)["pending_actions"][0]["id"] == owned.action_id


# --- websocket ------------------------------------------------------------------------


async def open_ws(
    server: ServerHandle, token: str | None = None, **kwargs: Any
) -> ClientConnection:
    url = server.ws_url if token is None else f"{server.ws_url}?token={token}"
    return await connect(url, open_timeout=TIMEOUT, close_timeout=2, **kwargs)


async def exchange(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send `frame` and return its answer; the connection must then still answer a ping.

    The intruder's token shares its command quota with the module's other tests: a frame
    refused by the token's rate limit is sent again after its `retry_after` (the answer
    compared is the one the frame itself gets, whatever the pace of the tests before)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            answer = await _answer(ws, frame)
            if answer.get("code") != "token_rate_limited":
                break
            await asyncio.sleep(float(answer.get("retry_after", 1)))
        await ws.send(orjson.dumps({"type": "ping", "id": "alive"}).decode())
        assert orjson.loads(await ws.recv()) == {"type": "pong", "id": "alive"}
    return answer


async def _answer(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    frame_id = f"f-{uuid.uuid4().hex[:8]}"
    await ws.send(orjson.dumps({**frame, "id": frame_id}).decode())
    while True:
        received: dict[str, Any] = orjson.loads(await ws.recv())
        # This connection subscribed to nothing: any live frame is a leak.
        assert received["type"] not in ("chunk", "invalidate", "resync"), received
        if received.get("id") == frame_id:
            return received


SAMPLES: dict[str, Any] = {
    "text": "intruder",
    "title": "taken over",
    "payload": {"approved": True},
    "output": {"ok": True},
    "visibility": "hidden",
    "metadata": {"owner": "intruder"},
}


def build_frame(model: type[BaseModel], ids: dict[str, str]) -> dict[str, Any]:
    """A valid frame of `model` for the thread in `ids`: every required field, known values."""
    frame: dict[str, Any] = {"type": frame_type(model)}
    for field_name, info in model.model_fields.items():
        if field_name in ("type", "id"):
            continue
        if field_name in ids:
            frame[field_name] = ids[field_name]
        elif field_name in SAMPLES:
            frame[field_name] = SAMPLES[field_name]
        else:
            assert not info.is_required(), f"add a sample for {model.__name__}.{field_name}"
    model.model_validate(frame)
    return frame


def without_ids(answer: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    text = orjson.dumps({k: v for k, v in answer.items() if k != "id"}).decode()
    for value in ids.values():
        text = text.replace(value, "<id>")
    return dict(orjson.loads(text))


# Frames that name a thread but do not look it up: the answer is the same for any id.
NO_LOOKUP = {"unsubscribe"}


@pytest.mark.parametrize("intruder", ["carol", "beta_svc", "beta_admin"])
async def test_every_frame_on_another_scope_is_not_found(
    server: ServerHandle, more_tokens: dict[str, str], owned: Owned, intruder: str
) -> None:
    async with httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {more_tokens['alice']}"},
        timeout=TIMEOUT,
    ) as owner:
        before = (await owner.get(f"/v1/threads/{owned.thread_id}")).json()
        ws = await open_ws(server, more_tokens[intruder])
        try:
            checked = set()
            for model in frame_models():
                if "thread_id" not in model.model_fields:
                    continue
                kind = frame_type(model)
                absent_ids = missing_ids()
                foreign = await exchange(ws, build_frame(model, owned.ids()))
                absent = await exchange(ws, build_frame(model, absent_ids))
                # Indistinguishable from a thread that does not exist.
                assert without_ids(foreign, owned.ids()) == without_ids(absent, absent_ids), kind
                if kind in NO_LOOKUP:
                    assert foreign["type"] == "unsubscribed", foreign
                elif kind == "action.manual_result" and intruder == "carol":
                    assert (foreign["type"], foreign["code"]) == ("error", "forbidden"), foreign
                else:
                    assert (foreign["type"], foreign["code"]) == ("error", "not_found"), foreign
                checked.add(kind)
            # The inbox frames name a scope, not a thread: tests/e2e/test_inbox.py checks that
            # another scope is not_found there.
            scoped = {"actions.subscribe", "actions.unsubscribe"}
            # Schedule, webhook and delivery frames name their own ids: test_hooks_api.py.
            hooks = {
                kind
                for kind in CLIENT_FRAME_TYPES
                if kind.startswith(("schedule.", "webhook.", "delivery.")) and kind not in checked
            }
            # `auth.refresh` names a token, not a thread: tests/e2e/test_token_refresh.py.
            own = {"ping", "auth.refresh"}
            assert checked == set(CLIENT_FRAME_TYPES) - own - scoped - hooks
        finally:
            await ws.close()
        after = (await owner.get(f"/v1/threads/{owned.thread_id}")).json()
        assert after == before


async def test_user_manual_result_frames_are_forbidden_everywhere(
    server: ServerHandle, tokens: dict[str, str], owned: Owned
) -> None:
    model = next(m for m in frame_models() if frame_type(m) == "action.manual_result")
    ws = await open_ws(server, tokens["alice"])
    try:
        for ids in (owned.ids(), missing_ids()):
            answer = await exchange(ws, build_frame(model, ids))
            assert (answer["type"], answer["code"]) == ("error", "forbidden"), answer
    finally:
        await ws.close()


def bad_ws_tokens(real: str) -> dict[str, str]:
    tampered = real[:-1] + ("A" if real[-1] != "A" else "B")
    return {
        "empty": "",
        "well-formed unknown": "tl_" + "Q" * 43,
        "overlong": "tl_" + "a" * 500,
        "tampered": tampered,
        "percent-encoded junk": "tl_%00%ff",
    }


async def assert_closed_4401(ws: ClientConnection) -> None:
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(TIMEOUT):
            frame = await ws.recv()
            pytest.fail(f"got a frame before the close: {frame!r}")
    assert info.value.rcvd is not None and info.value.rcvd.code == 4401


@pytest.mark.parametrize("label", list(bad_ws_tokens("tl_x")))
async def test_websocket_bad_query_tokens_close_4401(
    server: ServerHandle, tokens: dict[str, str], label: str
) -> None:
    ws = await open_ws(server, bad_ws_tokens(tokens["alice"])[label])
    await assert_closed_4401(ws)


async def test_websocket_authorization_header(server: ServerHandle, tokens: dict[str, str]) -> None:
    for bad in ("Bearer tl_" + "Q" * 43, f"Basic {tokens['alice']}", "Bearer"):
        ws = await open_ws(server, additional_headers={"Authorization": bad})
        await assert_closed_4401(ws)
    # A good header token works (documented for non-browser clients).
    ws = await open_ws(server, additional_headers={"Authorization": f"Bearer {tokens['alice']}"})
    try:
        await ws.send('{"type": "ping", "id": 1}')
        assert orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)) == {"type": "pong", "id": 1}
    finally:
        await ws.close()
