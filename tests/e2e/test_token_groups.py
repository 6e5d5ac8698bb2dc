"""Groups on the server's own `tl_` tokens (`threadline token create --group`): an approval
routed to a group is decided by a holder of a token in it, refused (403 `not_a_decider`,
nothing changed) to one outside it, and found in the holder's assigned inbox."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e import cluster, harness
from tests.e2e.approvals_agent import EFFECTS_ENV

T = "/v1/threads"
POLICIES = {"send_email": {"groups": ["ops"], "exclude_requester": True}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.ServerHandle, Path]]:
    directory = tmp_path_factory.mktemp("groups")
    effects = directory / "effects"
    effects.touch()
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "PYTHONPATH": str(harness.ROOT),
            "THREADLINE_AGENT": "tests.e2e.approvals_agent:agent",
            "THREADLINE_DEMO_DELAY_MS": "0",
            "THREADLINE_APPROVAL_POLICIES": orjson.dumps(POLICIES).decode(),
            EFFECTS_ENV: str(effects),
        },
    )
    with harness.start(env=env, log_dir=directory) as server:
        yield server, effects


def call(server: harness.ServerHandle, token: str, method: str, path: str, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=30, **kw)


def test_a_group_routed_approval_is_decided_by_a_token_in_the_group(
    served: tuple[harness.ServerHandle, Path],
) -> None:
    server, effects = served
    bob = server.token("alpha", subject="bob", groups=("ops", "oncall"))  # the CLI's --group
    specs: dict[str, cluster.TokenSpec] = {
        "alice": ("alpha", "user", "alice"),
        "carol": ("alpha", "user", "carol"),
    }
    minted = cluster.mint(
        server.env["THREADLINE_DATABASE_URL"], specs, groups={"carol": ("finance",)}
    )
    alice, carol = minted["alice"], minted["carol"]
    thread_id = call(server, alice, "POST", T, json={}).json()["thread"]["id"]
    sent = call(server, alice, "POST", f"{T}/{thread_id}/messages", json={"text": "email d@x.io"})
    assert sent.status_code == 202, sent.text
    deadline = time.monotonic() + 30
    snap: dict[str, Any] = {}
    while time.monotonic() < deadline and not snap.get("pending_actions"):
        snap = call(server, alice, "GET", f"{T}/{thread_id}").json()
        time.sleep(0.05)
    [action] = snap["pending_actions"]
    assert action["approval"]["policy"]["groups"] == ["ops"]
    assigned = call(server, bob, "GET", "/v1/actions?assigned=me").json()["actions"]
    assert [a["id"] for a in assigned] == [action["id"]]
    assert call(server, carol, "GET", "/v1/actions?assigned=me").json()["actions"] == []

    resume = f"{T}/{thread_id}/actions/{action['id']}/resume"
    refused = call(server, carol, "POST", resume, json={"payload": {"approved": True}})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "not_a_decider"
    assert call(server, alice, "GET", f"{T}/{thread_id}").json() == snap  # nothing changed

    approved = call(server, bob, "POST", resume, json={"payload": {"approved": True}})
    assert approved.status_code == 200, approved.text
    while time.monotonic() < deadline and snap["run"]["status"] != "completed":
        snap = call(server, alice, "GET", f"{T}/{thread_id}").json()
        time.sleep(0.05)
    assert snap["run"]["status"] == "completed"
    assert effects.read_text().split() == [action["tool_call_id"]]

    listed = harness.run_command(["token", "list", "--json"], server.env)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    groups = {row["subject"]: row["groups"] for row in rows if row["subject"] != "dev"}
    assert groups == {"alice": [], "bob": ["oncall", "ops"], "carol": ["finance"]}


def test_a_bad_group_is_refused_by_the_cli_and_mints_nothing(
    served: tuple[harness.ServerHandle, Path],
) -> None:
    server, _ = served
    before = harness.run_command(["token", "list", "--json"], server.env).stdout
    done = harness.run_command(
        ["token", "create", "--scope", "alpha", "--subject", "dan", "--group", "x" * 129],
        server.env,
    )
    assert done.returncode != 0 and "--group" in done.stderr, done.stderr
    assert harness.run_command(["token", "list", "--json"], server.env).stdout == before
