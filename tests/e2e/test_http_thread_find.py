"""Over HTTP: thread metadata patched by a command, and the thread list filtered and paged."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.e2e.conftest import Api, assert_error


def test_a_metadata_patch_is_a_version_the_snapshot_shows(alice: Api, api_for: Any) -> None:
    thread = alice.create_thread(metadata={"owner": "alice", "tags": {"a": 1}})["thread"]
    path = f"/v1/threads/{thread['id']}/metadata"
    patch = {"metadata": {"owner": None, "tags": {"b": 2}}}
    answer = api_for("bob").request("PATCH", path, json=patch)  # any user of the scope
    assert answer.status_code == 200, answer.text
    merged = {"tags": {"a": 1, "b": 2}}
    assert answer.json() == {
        "thread_id": thread["id"],
        "version": thread["version"] + 1,
        "metadata": merged,
    }
    assert alice.snapshot(thread["id"])["thread"]["metadata"] == merged
    for body in ({"metadata": "x"}, {"metadata": {"a": "\x00"}}, {}, {"metadata": {}, "x": 1}):
        assert_error(alice.request("PATCH", path, json=body), 422, "invalid_input")
    assert_error(api_for("carol").request("PATCH", path, json=patch), 404, "not_found")
    assert alice.snapshot(thread["id"])["thread"]["version"] == thread["version"] + 1


def test_the_list_is_filtered_by_metadata_and_paged_by_cursor(alice: Api) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    made = [alice.create_thread(metadata={"owner": owner})["thread"]["id"] for _ in range(5)]
    alice.create_thread(metadata={"owner": "someone else"})
    seen: list[str] = []
    params: dict[str, Any] = {"metadata.owner": owner, "limit": 2, "status": "idle"}
    for _ in range(len(made)):  # bounded: each page advances or the test fails
        page = alice.request("GET", "/v1/threads", params=params)
        assert page.status_code == 200, page.text
        seen += [t["id"] for t in page.json()["threads"]]
        alice.create_thread(metadata={"owner": owner})  # created meanwhile: sorts before
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
        params["cursor"] = cursor
    assert seen == list(reversed(made))


@pytest.mark.parametrize(
    "query",
    [
        "status=sleeping",
        "cursor=nope",
        "updated_after=soon",
        "metadata.=x",
        "ownr=alice",
        "limit=0",
    ],
)
def test_a_bad_list_query_is_invalid_input(alice: Api, query: str) -> None:
    assert_error(alice.request("GET", f"/v1/threads?{query}"), 422, "invalid_input")
