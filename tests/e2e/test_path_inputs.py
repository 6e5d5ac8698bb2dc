"""Ids in paths and values in queries, on every route of a real server: never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.protocol.commands import COMMANDS
from tests.e2e import harness

ROUTES = [(c.http.method, c.http.path) for c in COMMANDS if c.http is not None] + [
    ("GET", "/v1/ai-sdk/chat/{thread_id}/stream")
]
QUERY = ("limit", "before", "cursor", "include_hidden", "status")
# Ids as a client may mangle them: any text, NUL and superscript digits included.
IDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40) | st.sampled_from(
    ["a\x00b", "\x00", "²", "thr_" + "x" * 300, ".", "..", "%", "a.b"]
)
VALUES = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ["²", "-1", "1e3", "99999999999999999999999", "\x00", "true", "0"]
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    directory = tmp_path_factory.mktemp("path-inputs")
    with harness.start(log_dir=directory, database_url=harness.sqlite_url(directory)) as server:
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
