"""Ids in paths, values in queries and AG-UI / AI SDK bodies, on every route of a real server
over SQLite and Postgres: never a 5xx, always the error body, nothing committed by a refusal."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.protocol.commands import COMMANDS
from tests.e2e import cluster, harness

ROUTES = [(c.http.method, c.http.path) for c in COMMANDS if c.http is not None] + [
    ("GET", "/v1/ai-sdk/chat/{thread_id}/stream"),
    ("POST", "/v1/ai-sdk/chat/{thread_id}/stop"),
]
QUERY = ("limit", "before", "cursor", "include_hidden", "status")
# Ids as a client may mangle them: any text, NUL and superscript digits included.
IDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40) | st.sampled_from(
    ["a\x00b", "\x00", "²", "thr_" + "x" * 300, ".", "..", "%", "a.b"]
)
VALUES = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ["²", "-1", "1e3", "99999999999999999999999", "\x00", "true", "0"]
)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    directory = tmp_path_factory.mktemp(f"path-inputs-{request.param}")
    database = (
        cluster.postgres_database()
        if request.param == "postgres"
        else contextlib.nullcontext(harness.sqlite_url(directory))
    )
    # Budgets no example runs out of: a refusal here is the input's, never a rate limit's.
    env = {"THREADLINE_TOKEN_RATE": "10000", "THREADLINE_TOKEN_BURST": "100000"}
    env |= {"THREADLINE_SCOPE_RATE": "10000", "THREADLINE_SCOPE_BURST": "100000"}
    with (
        database as database_url,
        harness.start(log_dir=directory, env=harness.server_env(database_url, env)) as server,
    ):
        token = server.token("alpha", "admin", "root")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=20.0) as http:
            yield http


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    route=st.sampled_from(ROUTES),
    ids=st.lists(IDS, min_size=3, max_size=3),
    query=st.dictionaries(st.sampled_from(QUERY), VALUES, max_size=3),
)
def test_no_id_or_query_value_answers_5xx(
    client: httpx.Client, route: tuple[str, str], ids: list[str], query: dict[str, str]
) -> None:
    method, template = route
    path = template
    for index, name in enumerate(("thread_id", "item_id", "action_id", "run_id", "message_id")):
        path = path.replace("{" + name + "}", quote(ids[index % 3], safe=""))
    response = client.request(method, path, params=query, content=b"" if method != "GET" else None)
    assert response.status_code < 500, (method, path, query, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)


def test_one_bad_id_gets_one_answer(client: httpx.Client) -> None:
    """A NUL in a path id is `invalid_input` over HTTP, as in a websocket frame."""
    for path in ("/v1/threads/a%00b", "/v1/ai-sdk/chat/a%00b/stream"):
        response = client.get(path)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_input"
    assert client.get("/v1/threads", params={"limit": "²"}).status_code == 422


# --- AG-UI and AI SDK bodies ------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
TEXTS = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(["a\x00b", ""])
ROLES = st.sampled_from(["user", "assistant", "tool", "system", "developer", "bogus"])


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`strategy`'s values, or any JSON at all in their place."""
    return strategy | JSON


def agui_bodies(known: list[str]) -> st.SearchStrategy[Any]:
    """RunAgentInput-shaped bodies: real and mangled thread and action ids, any field's value
    replaced by any JSON now and then."""
    ids = IDS | st.sampled_from(known)
    message = st.fixed_dictionaries(
        {"id": maybe(ids), "role": maybe(ROLES), "content": maybe(TEXTS)},
        optional={"toolCallId": maybe(ids)},
    )
    resume = st.fixed_dictionaries(
        {
            "interruptId": maybe(ids),
            "status": maybe(st.sampled_from(["resolved", "cancelled", "bogus"])),
        },
        optional={"payload": JSON},
    )
    tool = st.fixed_dictionaries(
        {"name": maybe(IDS), "description": maybe(TEXTS), "parameters": JSON}
    )
    return st.fixed_dictionaries(
        {"threadId": maybe(ids), "runId": maybe(IDS), "messages": st.lists(message, max_size=3)},
        optional={
            "state": JSON,
            "tools": st.lists(tool, max_size=2),
            "context": JSON,
            "forwardedProps": maybe(st.fixed_dictionaries({"policy": maybe(VALUES)})),
            "resume": st.lists(resume, max_size=2),
        },
    )


def chat_bodies(known: list[str]) -> st.SearchStrategy[Any]:
    """AI SDK chat bodies: text, approval and tool-output parts with mangled ids and values."""
    ids = IDS | st.sampled_from(known)
    part = st.fixed_dictionaries(
        {"type": maybe(st.sampled_from(["text", "tool-send_email", "dynamic-tool", "step-start"]))},
        optional={
            "text": maybe(TEXTS),
            "state": maybe(
                st.sampled_from(["approval-responded", "output-available", "output-error"])
            ),
            "toolCallId": maybe(ids),
            "approval": maybe(
                st.fixed_dictionaries(
                    {"id": maybe(ids), "approved": maybe(st.booleans())},
                    optional={"reason": maybe(TEXTS)},
                )
            ),
            "output": JSON,
            "errorText": maybe(TEXTS),
        },
    )
    message = st.fixed_dictionaries(
        {"id": maybe(ids), "role": maybe(ROLES), "parts": maybe(st.lists(part, max_size=3))}
    )
    return st.fixed_dictionaries(
        {
            "id": maybe(ids),
            "trigger": maybe(st.sampled_from(["submit-message", "regenerate-message", "bogus"])),
            "messages": maybe(st.lists(message, max_size=2)),
        },
        optional={"messageId": maybe(ids)},
    )


@pytest.fixture(scope="module")
def known(client: httpx.Client) -> list[str]:
    """Ids worth aiming at: a thread whose run waits on an approval, and that action's id."""
    thread_id = str(client.post("/v1/threads", json={}).json()["thread"]["id"])
    sent = client.post(f"/v1/threads/{thread_id}/messages", json={"text": "email a@example.com"})
    assert sent.status_code == 202, sent.text
    for _ in range(400):  # bounded: the demo agent suspends in well under a second
        snapshot = client.get(f"/v1/threads/{thread_id}").json()
        if snapshot["pending_actions"]:
            return [thread_id, str(snapshot["pending_actions"][0]["id"]), uuid.uuid4().hex]
        client.get("/healthz")
    raise AssertionError(f"the run of {thread_id} never waited: {snapshot}")


def committed(client: httpx.Client) -> Any:
    """The scope's threads and their versions: what any committed change moves."""
    listing = client.get("/v1/threads", params={"limit": "500"})
    assert listing.status_code == 200, listing.text
    return sorted((t["id"], t["version"]) for t in listing.json()["threads"])


def post_checked(client: httpx.Client, path: str, body: Any) -> None:
    """POST `body`: never a 5xx; a refusal is the error body and commits nothing."""
    before = committed(client)
    with client.stream("POST", path, json=body) as response:
        content = response.read()
    assert response.status_code < 500, (path, body, content)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str), error
        assert committed(client) == before, (path, body, error)


FUZZ = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(data=st.data())
def test_no_agui_body_answers_5xx_or_commits_a_refusal(
    client: httpx.Client, known: list[str], data: st.DataObject
) -> None:
    post_checked(client, "/v1/ag-ui", data.draw(agui_bodies(known)))


@FUZZ
@given(data=st.data())
def test_no_ai_sdk_body_answers_5xx_or_commits_a_refusal(
    client: httpx.Client, known: list[str], data: st.DataObject
) -> None:
    post_checked(client, "/v1/ai-sdk/chat", data.draw(chat_bodies(known)))
