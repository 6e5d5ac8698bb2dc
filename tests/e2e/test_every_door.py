"""Every door, every guard: one table of guards times one table of transports, on a real server.

Each cell makes the request a guard must refuse, through one transport, and asserts the
documented refusal (docs/protocol.md, "Every door") and that the victim scope's committed state
is unchanged. A transport added to `DOORS` without a cell for every guard fails here; a cell
that does not apply says why (a string), and only reads or protocols that carry their client's
own fields may say so.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.e2e import harness
from tests.e2e.run_inputs import agui_input

GUARDS = (
    "rate_limit",
    "queue_bound",
    "body_limit",
    "nul",
    "deep_json",
    "unknown_field",
    "foreign_scope",
    "permission",
)
BODY_LIMIT = 4096
FRAME_LIMIT = 4096
BURST = 30  # a spent token's whole budget: the rate is too slow to refill during the test


def deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = {"a": value}
    return value


@dataclass(frozen=True)
class Refused:
    """What a cell saw: an HTTP status and error code, an error frame's code (status 0), a
    RUN_ERROR event's code in a 200 stream, or a websocket close code (code `close:<n>`)."""

    status: int
    code: str


@dataclass
class World:
    server: harness.ServerHandle
    tokens: dict[str, str]
    waiting: str  # alice's thread, its run waiting on an approval, its queue full
    run: str  # that run
    done: str  # alice's thread with a completed reply

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def post(self, who: str, path: str, body: Any = None, raw: bytes | None = None) -> Refused:
        content = raw if raw is not None else json.dumps(body).encode()
        headers = {**self.headers(who), "content-type": "application/json"}
        with httpx.stream(
            "POST", self.server.url + path, content=content, headers=headers, timeout=20.0
        ) as response:
            return refusal(response)

    def get(self, who: str, path: str) -> Refused:
        with httpx.stream(
            "GET", self.server.url + path, headers=self.headers(who), timeout=20.0
        ) as response:
            return refusal(response)

    def frame(self, who: str, frame: dict[str, Any] | str) -> Refused:
        url = f"{self.server.ws_url}?token={self.tokens[who]}"
        with connect(url, max_size=None, open_timeout=20) as ws:
            ws.send(frame if isinstance(frame, str) else json.dumps({"id": 1, **frame}))
            try:
                while True:
                    answer = json.loads(ws.recv(timeout=20))
                    if answer.get("id") == 1:
                        return Refused(0, str(answer.get("code", answer["type"])))
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else 1006
                return Refused(0, f"close:{code}")

    def state(self) -> Any:
        """The victim scope's committed state: its threads and their snapshots."""
        listing = httpx.get(
            f"{self.server.url}/v1/threads", headers=self.headers("admin"), timeout=20.0
        )
        assert listing.status_code == 200, listing.text
        threads = sorted(t["id"] for t in listing.json()["threads"])
        return {
            thread_id: httpx.get(
                f"{self.server.url}/v1/threads/{thread_id}?include_hidden=true",
                headers=self.headers("admin"),
                timeout=20.0,
            ).json()
            for thread_id in threads
        }


def refusal(response: httpx.Response) -> Refused:
    if response.status_code != 200:
        body = json.loads(response.read() or b"{}")
        return Refused(response.status_code, body.get("error", {}).get("code", ""))
    for line in response.iter_lines():
        if line.startswith("data:") and '"RUN_ERROR"' in line:
            return Refused(200, json.loads(line[5:])["code"])
    return Refused(200, "")


def chat(chat_id: str, text: str = "hi", **part: Any) -> dict[str, Any]:
    parts = [{"type": "text", "text": text, **part}]
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": parts}
    return {"id": chat_id, "trigger": "submit-message", "messages": [message]}


Cell = Callable[[World], Refused] | str
T = "/v1/threads"


def _http(w: World) -> dict[str, Cell]:
    return {
        "rate_limit": lambda w: w.post("spent_http", T, {"title": "x"}),
        "queue_bound": lambda w: w.post("alice", f"{T}/{w.waiting}/messages", {"text": "more"}),
        "body_limit": lambda w: w.post("alice", T, {"title": "x" * BODY_LIMIT}),
        "nul": lambda w: w.post("alice", f"{T}/{w.waiting}%00/messages", {"text": "a"}),
        "deep_json": lambda w: w.post("alice", T, {"metadata": deep(100)}),
        "unknown_field": lambda w: w.post("alice", T, {"title": "x", "bogus": 1}),
        "foreign_scope": lambda w: w.post("carol", f"{T}/{w.waiting}/messages", {"text": "x"}),
        "permission": lambda w: w.post("bob", f"{T}/{w.waiting}/runs/{w.run}/stop", raw=b""),
    }


def _ws(w: World) -> dict[str, Cell]:
    send = {"type": "message.send"}
    return {
        "rate_limit": lambda w: w.frame("spent_ws", {**send, "thread_id": w.waiting, "text": "x"}),
        "queue_bound": lambda w: w.frame("alice", {**send, "thread_id": w.waiting, "text": "x"}),
        "body_limit": lambda w: w.frame(
            "alice", {**send, "thread_id": w.waiting, "text": "x" * FRAME_LIMIT}
        ),
        "nul": lambda w: w.frame("alice", {**send, "thread_id": w.waiting, "text": "a\x00b"}),
        "deep_json": lambda w: w.frame(
            "alice",
            {
                **send,
                "thread_id": w.waiting,
                "text": "x",
                "client_tools": [{"name": "t", "parameters": deep(100)}],
            },
        ),
        "unknown_field": lambda w: w.frame(
            "alice", {**send, "thread_id": w.waiting, "text": "x", "bogus": 1}
        ),
        "foreign_scope": lambda w: w.frame("carol", {**send, "thread_id": w.waiting, "text": "x"}),
        "permission": lambda w: w.frame(
            "bob", {"type": "run.stop", "thread_id": w.waiting, "run_id": w.run}
        ),
    }


def _agui(w: World) -> dict[str, Cell]:
    path = "/v1/ag-ui"
    tools = [{"name": "t", "description": "", "parameters": deep(100)}]
    return {
        "rate_limit": lambda w: w.post("spent_agui", path, agui_input(w.waiting)),
        "queue_bound": lambda w: w.post("alice", path, agui_input(w.waiting, "more")),
        "body_limit": lambda w: w.post("alice", path, agui_input(w.waiting, "x" * BODY_LIMIT)),
        "nul": lambda w: w.post("alice", path, agui_input(w.waiting, "a\x00b")),
        "deep_json": lambda w: w.post("alice", path, agui_input(w.done, "x", tools=tools)),
        "unknown_field": "RunAgentInput carries the client's own fields (ag-ui allows extras)",
        # A foreign id is a free one: carol's request acts on a thread of her own.
        "foreign_scope": lambda w: w.post("carol", path, agui_input(w.waiting, "hello")),
        "permission": lambda w: w.post(
            "bob",
            path,
            agui_input(w.waiting, resume=[{"interruptId": pending(w), "status": "cancelled"}]),
        ),
    }


def _aisdk(w: World) -> dict[str, Cell]:
    path = "/v1/ai-sdk/chat"
    return {
        "rate_limit": lambda w: w.post("spent_aisdk", path, chat(w.done)),
        # A chat shows one response at a time: it never queues, a busy thread is run_active.
        "queue_bound": lambda w: w.post("alice", path, chat(w.waiting)),
        "body_limit": lambda w: w.post("alice", path, chat(w.done, "x" * BODY_LIMIT)),
        "nul": lambda w: w.post("alice", path, chat(w.done, "a\x00b")),
        # Parts are read, not stored: JSON past the parser's depth is refused as it is read.
        "deep_json": lambda w: w.post("alice", path, chat(w.done, extra=deep(300))),
        "unknown_field": "the SDK's body carries the client's own fields (its `body` option)",
        "foreign_scope": lambda w: w.post("carol", path, chat(w.waiting)),
        "permission": lambda w: w.post(
            "bob", path, {"id": w.done, "trigger": "regenerate-message", "messages": []}
        ),
    }


def _stream(w: World) -> dict[str, Cell]:
    path = "/v1/ai-sdk/chat/{}/stream"
    return {
        "rate_limit": lambda w: w.get("spent_stream", path.format(w.waiting)),
        "queue_bound": "a read: it queues nothing",
        "body_limit": "a GET: it reads no body",
        "nul": lambda w: w.get("alice", path.format("a%00b")),
        "deep_json": "a GET: it reads no body",
        "unknown_field": "a GET: it reads no body",
        # w.done: carol never named it (the AG-UI cell gives her own thread of w.waiting).
        "foreign_scope": lambda w: w.get("carol", path.format(w.done)),
        "permission": "a read: scope is its only permission",
    }


DOORS: dict[str, Callable[[World], dict[str, Cell]]] = {
    "http": _http,
    "websocket": _ws,
    "ag-ui": _agui,
    "ai-sdk": _aisdk,
    "sse-stream": _stream,
}
# The documented refusal of each guard, per transport where it differs from the first.
EXPECTED: dict[str, dict[str, Refused]] = {
    "rate_limit": {
        "*": Refused(429, "token_rate_limited"),
        "websocket": Refused(0, "token_rate_limited"),
    },
    "queue_bound": {
        "http": Refused(429, "queue_full"),
        "websocket": Refused(0, "queue_full"),
        "ag-ui": Refused(200, "queue_full"),
        "ai-sdk": Refused(409, "run_active"),
    },
    "body_limit": {"*": Refused(413, "too_large"), "websocket": Refused(0, "close:1009")},
    "nul": {"*": Refused(422, "invalid_input"), "websocket": Refused(0, "invalid_input")},
    "deep_json": {"*": Refused(422, "invalid_input"), "websocket": Refused(0, "invalid_input")},
    "unknown_field": {"*": Refused(422, "invalid_input"), "websocket": Refused(0, "invalid_input")},
    "foreign_scope": {
        "*": Refused(404, "not_found"),
        "websocket": Refused(0, "not_found"),
        "ag-ui": Refused(200, ""),  # served: on carol's own thread of that id
        "ai-sdk": Refused(200, ""),
    },
    "permission": {"*": Refused(403, "forbidden"), "websocket": Refused(0, "forbidden")},
}


def pending(w: World) -> str:
    snapshot = httpx.get(
        f"{w.server.url}/v1/threads/{w.waiting}", headers=w.headers("alice"), timeout=20.0
    ).json()
    return str(snapshot["pending_actions"][0]["id"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("every-door")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "THREADLINE_QUEUE_MAX_ITEMS": "1",
            "THREADLINE_HTTP_MAX_BODY_BYTES": str(BODY_LIMIT),
            "THREADLINE_WS_MAX_FRAME_BYTES": str(FRAME_LIMIT),
            "THREADLINE_TOKEN_RATE": "0.001",
            "THREADLINE_TOKEN_BURST": str(BURST),
            "THREADLINE_PERMISSION_STOP": "author",
            "THREADLINE_PERMISSION_REGENERATE": "author",
        },
    )
    with harness.start(env=env, log_dir=directory) as server:
        who = {
            "alice": ("alpha", "user", "alice"),
            "bob": ("alpha", "user", "bob"),
            "carol": ("beta", "user", "carol"),
            "admin": ("alpha", "admin", "root"),
        }
        tokens = {name: server.token(*spec) for name, spec in who.items()}
        for door in ("http", "ws", "agui", "aisdk", "stream"):
            tokens[f"spent_{door}"] = server.token("alpha", "user", f"spender-{door}")
        w = World(server, tokens, "", "", "")
        w.done = start_thread(w, "hello there", "completed")
        w.waiting = start_thread(w, "email dave@example.com please", "waiting")
        w.run = httpx.get(
            f"{server.url}{T}/{w.waiting}", headers=w.headers("alice"), timeout=20.0
        ).json()["run"]["id"]
        queued = w.post("alice", f"{T}/{w.waiting}/messages", {"text": "fills the queue"})
        assert queued.status == 202, queued
        for door in ("http", "ws", "agui", "aisdk", "stream"):
            spend(w, f"spent_{door}")
        yield w


def start_thread(w: World, text: str, status: str) -> str:
    api = w.server.url
    created = httpx.post(f"{api}{T}", json={}, headers=w.headers("alice"), timeout=20.0).json()
    thread_id = str(created["thread"]["id"])
    sent = httpx.post(
        f"{api}{T}/{thread_id}/messages", json={"text": text}, headers=w.headers("alice")
    )
    assert sent.status_code == 202, sent.text
    for _ in range(200):  # bounded: the demo agent settles in well under a second
        snapshot = httpx.get(f"{api}{T}/{thread_id}", headers=w.headers("alice")).json()
        if snapshot["run"] and snapshot["run"]["status"] == status:
            return thread_id
        httpx.get(f"{api}/healthz")
    raise AssertionError(f"the run of {thread_id} never became {status}: {snapshot['run']}")


def spend(w: World, who: str) -> None:
    """Spend the token's whole budget on commands that change nothing (stops of no run)."""
    for _ in range(BURST):
        w.post(who, f"{T}/{w.done}/runs/no-such-run/stop", raw=b"")
    assert w.post(who, f"{T}/{w.done}/runs/no-such-run/stop", raw=b"").code == "token_rate_limited"


@pytest.mark.parametrize("guard", GUARDS)
@pytest.mark.parametrize("door", sorted(DOORS))
def test_every_door_refuses_and_changes_nothing(world: World, door: str, guard: str) -> None:
    cells = DOORS[door](world)
    assert set(cells) == set(GUARDS), f"transport {door} must have a cell for every guard"
    cell = cells[guard]
    if isinstance(cell, str):
        assert cell, f"{door}/{guard}: say why the guard does not apply"
        return
    before = world.state()
    seen = cell(world)
    expected = EXPECTED[guard].get(door, EXPECTED[guard].get("*"))
    assert seen == expected, (door, guard, seen)
    assert world.state() == before, f"{door}/{guard} changed committed state"


@pytest.mark.parametrize(
    "refused",
    [
        # The message's policy is refused after the stop entry is read (it was committed first).
        {"forwardedProps": {"policy": "bogus"}, "text": "and then this"},
        # A second entry's payload fails the action's schema (its check runs before any commit).
        {"resume": [{"interruptId": "", "status": "resolved", "payload": {"approved": "maybe"}}]},
    ],
    ids=["policy", "payload"],
)
def test_an_agui_act_is_all_or_nothing(world: World, refused: dict[str, Any]) -> None:
    """A stop of the waiting run, then a refused part of the same input: nothing commits."""
    action = pending(world)
    resume = [{"interruptId": action, "status": "cancelled"}]
    for entry in refused.get("resume", []):
        resume.append({**entry, "interruptId": action})
    extra = {k: v for k, v in refused.items() if k not in ("resume", "text")}
    body = agui_input(world.waiting, refused.get("text"), resume=resume, **extra)
    before = world.state()
    seen = world.post("alice", "/v1/ag-ui", body)
    assert seen.status in (400, 422), seen
    assert world.state() == before
