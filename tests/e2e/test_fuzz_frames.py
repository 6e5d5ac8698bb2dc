"""Hypothesis-generated frames and bodies against a live server: answered, or a documented close."""

from __future__ import annotations

import contextlib
import json
import time
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from server.app import create_app
from server.protocol.client_frames import CLIENT_FRAME_TYPES, ClientFrame
from server.protocol.commands import BY_NAME
from server.settings import Settings
from tests.e2e.conftest import Api
from tests.e2e.harness import ServerHandle

TIMEOUT = 10.0
POOL = 3
MAX_FRAME = 64 * 1024  # THREADLINE_WS_MAX_FRAME_BYTES default: the test server uses it
UVICORN_MAX = 4 * MAX_FRAME  # uvicorn's own bound (server/cli.py), also closes with 1009
ID_MAX = 200
# docs/protocol.md, "Errors" and "Bad frames". internal_error and lease_lost are documented
# too, but a frame must never cause an unexpected failure: they count as bugs here.
ERROR_CODES = {
    "unauthorized",
    "forbidden",
    "not_found",
    "bad_request",
    "invalid_json",
    "invalid_input",
    "invalid_payload",
    "too_large",
    "conflict",
    "run_active",
    "illegal_transition",
    "invariant_violation",
    "unavailable",
    "invalid_frame",
    "unknown_type",
    "too_many_subscriptions",
    # docs/protocol.md, "Limits": a fuzzer sending commands fast meets the rate limits.
    "token_rate_limited",
    "scope_rate_limited",
    "queue_full",
    "scope_runs_exceeded",
}
# The answer type of each frame with a reply of its own (the command table's); the rest: ack.
ANSWER_OF = {
    name: command.reply.model_fields["type"].default
    for name, command in BY_NAME.items()
    if command.reply is not None
}
LIVE = {"chunk", "invalidate", "resync"}
# What a subscriber is told about who else is in the thread (docs/protocol.md, "Presence").
PRESENCE = {"presence", "presence.join", "presence.update", "presence.leave"}
# What an `actions.subscribe` connection is pushed about its scopes (docs/protocol.md, "Inbox").
INBOX = {"action.pending", "action.resolved", "actions.resync"}
FIELDS = (
    "thread_id",
    "action_id",
    "run_id",
    "message_id",
    "item_id",
    "text",
    "payload",
    "output",
    "error",
    "expected_version",
    "client_request_id",
    "policy",
    "client_tools",
    "visibility",
)


@dataclass
class Sent:
    """One fuzz frame as it goes on the wire, and what the protocol says about it."""

    data: str | bytes
    frame: Any = None  # the decoded JSON value, when it is JSON
    oversize: bool = False


def wire_size(data: str | bytes) -> int:
    return len(data.encode("utf-8") if isinstance(data, str) else data)


# --- strategies -----------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
GOOD_IDS = st.text(max_size=ID_MAX) | st.integers(min_value=-(2**63), max_value=2**63 - 1)
BAD_IDS = st.booleans() | st.floats() | st.just("i" * (ID_MAX + 1)) | JSON_VALUES
FRAME_IDS = GOOD_IDS | GOOD_IDS | GOOD_IDS | BAD_IDS


def encode(value: Any, binary: bool) -> Sent:
    # json, not orjson: it writes NaN, Infinity and integers beyond 64 bits (invalid or
    # out-of-range JSON that the server must still answer).
    text = json.dumps(value, allow_nan=True)
    return Sent(text.encode() if binary else text, value, wire_size(text) > MAX_FRAME)


def frame_models() -> dict[str, Any]:
    """Frame type -> pydantic model, read from the client frame union itself."""
    union, *_ = typing.get_args(ClientFrame)
    models = typing.get_args(union)
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in models}


MODELS = frame_models()


@st.composite
def known_frames(draw: st.DrawFn, ids: dict[str, list[str]]) -> Sent:
    """Objects with a known `type` whose fields are mostly right, sometimes wrong or missing,
    so that valid commands (which act on the thread) are among them."""
    kind = draw(st.sampled_from(CLIENT_FRAME_TYPES))
    frame: dict[str, Any] = {"type": kind}
    plausible: dict[str, st.SearchStrategy[Any]] = {
        name: st.sampled_from(values) for name, values in ids.items()
    }
    plausible |= {
        "text": st.text(min_size=1, max_size=200),
        "payload": st.fixed_dictionaries(
            {"approved": st.booleans()}, optional={"note": st.text(max_size=10)}
        ),
        "output": JSON_VALUES,
        "error": st.none() | st.text(max_size=20),
        "visibility": st.sampled_from(["hidden", "visible"]),
        "policy": st.sampled_from(["enqueue", "reject", "interrupt"]),
        "expected_version": st.none() | st.integers(min_value=0, max_value=50),
        "client_request_id": st.text(min_size=1, max_size=20),
        "client_tools": st.lists(
            st.fixed_dictionaries({"name": st.text(min_size=1, max_size=10)}), max_size=2
        ),
    }
    for name in MODELS[kind].model_fields:
        if name in ("type", "id"):
            continue
        how = draw(st.sampled_from(["right"] * 8 + ["wrong", "missing"]))
        if how == "right":
            frame[name] = draw(plausible.get(name, JSON_VALUES))
        elif how == "wrong":
            frame[name] = draw(JSON_VALUES)
    if draw(st.booleans()):
        frame["id"] = draw(FRAME_IDS)
    if draw(st.integers(min_value=0, max_value=5)) == 0:
        frame[draw(st.sampled_from(FIELDS) | st.text(min_size=1, max_size=8))] = draw(JSON_VALUES)
    return encode(frame, draw(st.integers(min_value=0, max_value=4)) == 0)


@st.composite
def unknown_objects(draw: st.DrawFn) -> Sent:
    frame = draw(st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=5))
    if draw(st.booleans()):
        frame["type"] = draw(st.text(max_size=40) | JSON_VALUES)
    return encode(frame, draw(st.booleans()))


@st.composite
def raw_frames(draw: st.DrawFn) -> Sent:
    """Anything at all: text (valid UTF-8, as websockets requires) or arbitrary bytes."""
    if draw(st.booleans()):
        text = draw(st.text(st.characters(exclude_categories=["Cs"]), max_size=80))
        return Sent(text)
    return Sent(draw(st.binary(max_size=80)))


@st.composite
def huge_frames(draw: st.DrawFn) -> Sent:
    """A ping padded to a size around the frame limit, in 1- or 2-byte characters."""
    size = draw(st.sampled_from([MAX_FRAME - 1, MAX_FRAME, MAX_FRAME + 1, UVICORN_MAX + 10]))
    size += draw(st.integers(min_value=-64, max_value=0))
    wide = draw(st.booleans())
    head = orjson.dumps({"type": "ping", "id": "big", "pad": ""}).decode()
    room = size - len(head)
    pad = "\u00e9" * (room // 2) + "x" * (room % 2) if wide else "x" * room
    frame = {"type": "ping", "id": "big", "pad": pad}
    data = orjson.dumps(frame).decode()
    return Sent(data, frame, wire_size(data) > MAX_FRAME)


@st.composite
def deep_frames(draw: st.DrawFn, ids: dict[str, list[str]]) -> Sent:
    """Nesting around the JSON parser's and the encoder's limits, bare or inside a command."""
    depth = draw(st.sampled_from([10, 200, 300, 1000, 1100, 20_000]))
    if draw(st.booleans()):
        return Sent("[" * depth + "]" * depth)
    nested: Any = {}
    for _ in range(min(depth, 1100)):
        nested = {"a": nested}
    thread_id = draw(st.sampled_from(ids["thread_id"]))
    action_id = draw(st.sampled_from(ids["action_id"]))
    frame = draw(
        st.sampled_from(
            [
                {"type": "action.resume", "action_id": action_id, "payload": nested},
                {"type": "action.client_result", "action_id": action_id, "output": nested},
                {
                    "type": "message.send",
                    "text": "deep",
                    "client_tools": [{"name": "deep", "parameters": nested}],
                },
            ]
        )
    )
    frame |= {"thread_id": thread_id, "id": "deep"}
    # json.dumps recurses too; past Python's limit the frame is built by hand.
    with contextlib.suppress(RecursionError):
        return Sent(json.dumps(frame), frame)
    return Sent('{"type": "ping", "id": "deep", "pad": ' + "[" * depth + "]" * depth + "}")


def any_frame(ids: dict[str, list[str]]) -> st.SearchStrategy[Sent]:
    return st.one_of(
        *[known_frames(ids)] * 4,
        unknown_objects(),
        raw_frames(),
        st.builds(lambda v, b: encode(v, b), JSON_VALUES, st.booleans()),
        huge_frames(),
        deep_frames(ids),
    )


# --- connections ----------------------------------------------------------------------


def open_connection(server: ServerHandle, token: str) -> ClientConnection:
    """An open connection; the caller closes it (used as a context manager, as websockets
    asks: entering it only marks it as such). No keepalive pings: websockets draws their
    payload from the global `random` in a background thread, and Hypothesis rejects a draw
    during which the global random state changed (a flaky failure on a slow machine)."""
    ws = connect(
        f"{server.ws_url}?token={token}",
        open_timeout=TIMEOUT,
        close_timeout=2,
        compression=None,
        max_size=2**24,
        max_queue=None,
        ping_interval=None,
    )
    return ws.__enter__()


@dataclass
class Pool:
    server: ServerHandle
    token: str
    thread_id: str
    ids: dict[str, list[str]]
    connections: list[ClientConnection] = field(default_factory=list)
    bystander: ClientConnection | None = None
    watched: list[dict[str, Any]] = field(default_factory=list)
    closes: list[int | None] = field(default_factory=list)
    examples: int = 0

    def replace(self, slot: int) -> None:
        with contextlib.suppress(Exception):
            self.connections[slot].close()
        self.connections[slot] = open_connection(self.server, self.token)

    def drain(self) -> None:
        """Read what the bystander got so far (its outbox must never fill up)."""
        assert self.bystander is not None
        while True:
            try:
                self.watched.append(orjson.loads(self.bystander.recv(timeout=0)))
            except TimeoutError:
                return

    def close(self) -> None:
        for ws in [*self.connections, self.bystander]:
            if ws is not None:
                with contextlib.suppress(Exception):
                    ws.close()


def schedule_of(api: Api, thread_id: str) -> str:
    made = api.request(
        "POST",
        "/v1/schedules",
        json={"thread_id": thread_id, "cron": "0 9 1 1 *", "text": "yearly"},
    )
    assert made.status_code == 201, made.text
    return str(made.json()["schedule"]["id"])


@pytest.fixture(scope="module")
def pool(server: ServerHandle, tokens: dict[str, str]) -> Iterator[Pool]:
    alice = Api(server.url, tokens["alice"])
    carol = Api(server.url, tokens["carol"])
    try:
        thread_id = alice.create_thread(title="fuzz")["thread"]["id"]
        sent = alice.send(thread_id, "please email fuzz@example.com now")
        waiting = alice.wait_run(thread_id, ("waiting",))
        foreign = carol.create_thread()["thread"]["id"]
        ids = {
            "thread_id": [thread_id, foreign],
            "action_id": [waiting["pending_actions"][0]["id"]],
            "run_id": [sent["run_id"]],
            "message_id": [sent["message_id"]],
            "item_id": ["q-none"],
            # Schedules, webhooks and deliveries: a real schedule and ids nobody has.
            "schedule_id": [schedule_of(alice, thread_id), "sch-none"],
            "webhook_id": ["wh-none"],
            "delivery_id": ["msg-none"],
            # The admin token routes' id (a hash prefix): one nobody has.
            "token_id": ["0" * 24],
        }
    finally:
        alice.close()
        carol.close()
    state = Pool(server, tokens["alice"], thread_id, ids)
    try:
        state.connections = [open_connection(server, state.token) for _ in range(POOL)]
        state.bystander = open_connection(server, state.token)
        state.bystander.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id}).decode())
        yield state
    finally:
        state.close()


def parsed(data: str | bytes) -> Any:
    """The frame as the server's JSON parser sees it (None when it cannot parse it)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def check_answer(sent: Sent, answer: dict[str, Any]) -> None:
    frame = parsed(sent.data)
    if answer["type"] == "error":
        assert answer["code"] in ERROR_CODES, answer
        assert isinstance(answer["message"], str) and answer["message"], answer
    else:
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str), answer
        assert answer["type"] == ANSWER_OF.get(frame["type"], "ack"), (frame, answer)
    if isinstance(frame, dict):
        # docs/protocol.md: the answer carries the frame's id "where it had a usable one".
        frame_id = frame.get("id")
        usable = (isinstance(frame_id, int) and not isinstance(frame_id, bool)) or (
            isinstance(frame_id, str) and len(frame_id) <= ID_MAX
        )
        if usable:
            assert answer.get("id") == frame_id, (frame_id, answer)


def exchange(state: Pool, slot: int, sent: Sent) -> None:
    """Send one fuzz frame and a sentinel ping; the frame must get exactly one answer before
    the sentinel's pong, or the connection must close with a documented code. A connection
    that closed (or left a check failing) is replaced, so examples stay independent."""
    ws = state.connections[slot]
    try:
        closed, answers = _send_and_collect(ws, sent)
    except BaseException:
        state.replace(slot)
        raise
    if closed is not None:
        state.replace(slot)
        state.closes.append(closed.code)
        if closed.code is None:
            # Past uvicorn's own bound the server drops the connection after reading only the
            # frame header; our sentinel then hits a closed socket and the TCP reset can
            # destroy the 1009 close frame before the client reads it.
            assert wire_size(sent.data) > UVICORN_MAX, (closed, sent.data[:200])
        else:
            assert sent.oversize and closed.code == 1009, (closed, sent.data[:200])
        return
    assert not sent.oversize, f"an oversize frame was answered: {answers}"
    assert len(answers) == 1, (sent.data[:300], answers)
    check_answer(sent, answers[0])


@dataclass(frozen=True)
class Closed:
    code: int | None


def _send_and_collect(
    ws: ClientConnection, sent: Sent
) -> tuple[Closed | None, list[dict[str, Any]]]:
    sentinel = f"sentinel-{uuid.uuid4().hex[:8]}"
    answers: list[dict[str, Any]] = []
    try:
        ws.send(sent.data)
        ws.send(orjson.dumps({"type": "ping", "id": sentinel}).decode())
        deadline = time.monotonic() + TIMEOUT
        while True:
            received = orjson.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if received == {"type": "pong", "id": sentinel}:
                return None, answers
            if received["type"] not in LIVE | PRESENCE | INBOX:  # pushed, not answers
                answers.append(received)
    except ConnectionClosed as exc:
        return Closed(exc.rcvd.code if exc.rcvd else None), answers


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(data=st.data())
def test_fuzzed_frames_are_answered_or_closed_cleanly(pool: Pool, data: st.DataObject) -> None:
    sent = data.draw(any_frame(pool.ids), label="frame")
    slot = data.draw(st.integers(min_value=0, max_value=POOL - 1), label="connection")
    assert pool.server.alive(), pool.server.log()[-3000:]
    exchange(pool, slot, sent)
    pool.drain()
    pool.examples += 1


# --- HTTP bodies: the same inputs through the routes ----------------------------------

# 204: the AI SDK resume route when no run is in flight (the status its client expects).
HTTP_STATUSES = {200, 201, 202, 204, 400, 403, 404, 405, 409, 413, 422, 429}
BODY_FIELDS = (*FIELDS, "title", "metadata", "scope")


def http_routes() -> list[tuple[str, str]]:
    # create_app only builds the route table: the storage URL is never opened.
    app = create_app(Settings(role="all", database_url="sqlite:///unused-never-opened.db"))
    return [
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route) and route.path.startswith("/v1/")
        for method in sorted((route.methods or set()) - {"HEAD"})
    ]


@st.composite
def http_bodies(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        nested: Any = draw(JSON_VALUES)
        for _ in range(draw(st.sampled_from([0, 1, 50, 300, 1000]))):
            nested = {"a": nested}
        body = {draw(st.sampled_from(BODY_FIELDS)): nested}
        if draw(st.booleans()):
            body["text"] = draw(st.text(min_size=1, max_size=50))
        with contextlib.suppress(RecursionError):
            return json.dumps(body, allow_nan=True).encode()
        return b"{}"
    return json.dumps(draw(JSON_VALUES), allow_nan=True).encode()


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_fuzzed_http_bodies_never_fail_unexpectedly(pool: Pool, data: st.DataObject) -> None:
    """Any JSON body on any route: a documented status and error code, never a 500."""
    method, path = data.draw(st.sampled_from(http_routes()), label="route")
    ids = {name: data.draw(st.sampled_from(values)) for name, values in pool.ids.items()}
    url = path.format(**ids)
    body = data.draw(http_bodies(), label="body")
    with httpx.Client(base_url=pool.server.url, timeout=TIMEOUT) as client:
        response = client.request(
            method,
            url,
            content=body,
            headers={"Authorization": f"Bearer {pool.token}", "content-type": "application/json"},
        )
    assert response.status_code in HTTP_STATUSES, (method, url, body[:200], response.text)
    if response.status_code >= 400:
        assert response.json()["error"]["code"] in ERROR_CODES | {"method_not_allowed"}


@pytest.mark.parametrize("depth", [300, 1000])
def test_deeply_nested_bodies_on_every_route(pool: Pool, depth: int) -> None:
    """Every body field of every route nested past orjson's output limit (254) and close to its
    parse limit (1024, deeper than pydantic can validate): never a 500."""
    nested = '{"a":' * depth + "{}" + "}" * depth
    ids = {name: values[0] for name, values in pool.ids.items()}
    with httpx.Client(
        base_url=pool.server.url,
        timeout=TIMEOUT,
        headers={"Authorization": f"Bearer {pool.token}"},
    ) as client:
        for method, path in http_routes():
            for name in BODY_FIELDS:
                # Alone, and next to the one field send_message requires.
                for body in (f'{{"{name}": {nested}}}', f'{{"text": "deep", "{name}": {nested}}}'):
                    response = client.request(
                        method,
                        path.format(**ids),
                        content=body,
                        headers={"Content-Type": "application/json"},
                    )
                    what = (method, path, name, response.text)
                    assert response.status_code in HTTP_STATUSES, what


def test_server_and_bystander_survived(pool: Pool, server: ServerHandle) -> None:
    """Runs after the fuzzing (same module, in order): nothing else was disturbed."""
    assert pool.examples >= 100, "the fuzz test did not run"
    assert server.alive()
    assert httpx.get(f"{server.url}/healthz", timeout=TIMEOUT).status_code == 200
    with open_connection(server, pool.token) as fresh:
        fresh.send('{"type": "ping", "id": "fresh"}')
        assert orjson.loads(fresh.recv(timeout=TIMEOUT)) == {"type": "pong", "id": "fresh"}
    assert pool.bystander is not None
    pool.bystander.send('{"type": "ping", "id": "still-here"}')
    deadline = time.monotonic() + TIMEOUT
    while not pool.watched or pool.watched[-1] != {"type": "pong", "id": "still-here"}:
        pool.watched.append(orjson.loads(pool.bystander.recv(timeout=deadline - time.monotonic())))
    assert pool.watched[0]["type"] == "subscribed"
    kinds = {frame["type"] for frame in pool.watched}
    assert kinds <= {"subscribed", "pong", *LIVE, *PRESENCE}, kinds
    versions = [f["version"] for f in pool.watched if f["type"] == "invalidate"]
    assert versions == sorted(set(versions))
    assert set(pool.closes) <= {1009, None}, pool.closes
