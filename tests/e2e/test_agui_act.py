"""AG-UI `act` through the route, on SQLite and Postgres: resumes and a message commit whole."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.e2e import cluster, harness
from tests.e2e.run_inputs import agui_input, approve

T = "/v1/threads"


@dataclass
class Server:
    handle: harness.ServerHandle
    tokens: dict[str, str]

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def get(self, path: str) -> Any:
        response = httpx.get(
            self.handle.url + path, headers=self.headers("alice"), timeout=20.0
        ).raise_for_status()
        return response.json()

    def post(self, who: str, path: str, body: Any) -> httpx.Response:
        return httpx.post(
            self.handle.url + path, json=body, headers=self.headers(who), timeout=20.0
        )

    def act(self, who: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST /v1/ag-ui and read the whole stream: its events (an error body as one event)."""
        with httpx.stream(
            "POST", self.handle.url + "/v1/ag-ui", json=body, headers=self.headers(who), timeout=60
        ) as response:
            if response.status_code != 200:
                return [
                    {"type": "HTTP", "status": response.status_code, **json.loads(response.read())}
                ]
            return [
                json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")
            ]

    def waiting_thread(self) -> tuple[str, str]:
        """A thread of alice's whose run waits on an e-mail approval: (thread id, action id)."""
        thread_id = str(self.post("alice", T, {}).json()["thread"]["id"])
        sent = self.post("alice", f"{T}/{thread_id}/messages", {"text": "email dave@example.com"})
        assert sent.status_code == 202, sent.text
        for _ in range(400):  # bounded: the demo agent suspends in well under a second
            snapshot = self.get(f"{T}/{thread_id}")
            if snapshot["run"]["status"] == "waiting" and snapshot["pending_actions"]:
                return thread_id, str(snapshot["pending_actions"][0]["id"])
            httpx.get(self.handle.url + "/healthz", timeout=20.0)
        raise AssertionError(f"the run of {thread_id} never waited: {snapshot}")

    def state(self, thread_id: str) -> Any:
        return self.get(f"{T}/{thread_id}?include_hidden=true")


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp(f"agui-act-{request.param}")
    database = (
        cluster.postgres_database()
        if request.param == "postgres"
        else contextlib.nullcontext(harness.sqlite_url(directory))
    )
    with (
        database as database_url,
        harness.start(
            env=harness.server_env(database_url, {"THREADLINE_QUEUE_MAX_ITEMS": "1"}),
            log_dir=directory,
        ) as handle,
    ):
        tokens = {who: handle.token("alpha", "user", who) for who in ("alice", "bob", "carol")}
        yield Server(handle, tokens)


def act_body(thread_id: str, action_id: str, text: str) -> dict[str, Any]:
    """Approve `action_id` and say `text`, in one RunAgentInput."""
    return agui_input(thread_id, text, run_id=uuid.uuid4().hex, resume=approve(action_id))


def errors(events: list[dict[str, Any]]) -> list[str]:
    return [
        str(e.get("code") or e.get("error", {}).get("code"))
        for e in events
        if e["type"] in ("RUN_ERROR", "HTTP")
    ]


def texts(snapshot: dict[str, Any]) -> list[str]:
    """Every user text the thread holds: its messages' and its queue's."""
    said = [
        part["text"]
        for message in snapshot["messages"]
        if message["role"] == "user"
        for part in message["parts"]
        if part["type"] == "text"
    ]
    return said + [item["text"] for item in snapshot["queue"]]


def test_a_resume_with_a_message_refused_at_commit_leaves_the_action_pending(
    server: Server,
) -> None:
    thread_id, action_id = server.waiting_thread()
    queued = server.post("alice", f"{T}/{thread_id}/messages", {"text": "fills the queue"})
    assert queued.status_code == 202, queued.text
    before = server.state(thread_id)
    # The checks before any commit pass (the action is pending, the payload valid); only the
    # store finds the queue full, while committing the message after the resolution.
    events = server.act("alice", act_body(thread_id, action_id, "one too many"))
    assert errors(events) == ["queue_full"], events
    after = server.state(thread_id)
    assert after == before
    assert [a["id"] for a in after["pending_actions"]] == [action_id]


def test_racing_acts_on_one_action_one_wins_whole(server: Server) -> None:
    thread_id, action_id = server.waiting_thread()
    contenders = ("alice", "bob", "carol")
    said = {who: f"{who} says go" for who in contenders}
    with ThreadPoolExecutor(len(contenders)) as pool:
        streams = dict(
            zip(
                contenders,
                pool.map(
                    lambda who: server.act(who, act_body(thread_id, action_id, said[who])),
                    contenders,
                ),
                strict=True,
            )
        )
    won = [who for who, events in streams.items() if not errors(events)]
    assert len(won) == 1, streams
    assert all(errors(streams[who]) == ["conflict"] for who in contenders if who not in won)
    snapshot = server.state(thread_id)
    # The winner's resolution and its message, nothing of the losers'.
    assert [t for t in texts(snapshot) if t.endswith(" says go")] == [said[won[0]]]
    calls = [
        part
        for message in snapshot["messages"]
        for part in message["parts"]
        if part["type"] == "tool-call" and part.get("waiting")
    ]
    assert [c["waiting"]["resolution"]["subject"] for c in calls] == won
