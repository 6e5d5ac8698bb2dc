"""The approval card of an action whose deadline escalated it: who is waited for now, when it
is due, which stage; the escalated decider approves from the page."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest
from playwright.sync_api import expect

from tests.browser.helpers import Api, OpenPage, Shot, expect_settled, send_from, three_people
from tests.e2e import harness

pytestmark = pytest.mark.browser
# Stage 0 (bob) is due after a second; stage 1 (carol) not for an hour: the escalated card is
# what stays on screen, however slow the page.
POLICIES = {
    "send_email": {
        "subjects": ["bob"],
        "deadline": 1,
        "escalations": [{"subjects": ["carol"], "deadline": 3600}],
    }
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    directory = tmp_path_factory.mktemp("deadline-card")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "PYTHONPATH": str(harness.ROOT),
            "THREADLINE_AGENT": "tests.e2e.approvals_agent:agent",
            "THREADLINE_DEMO_DELAY_MS": "0",
            "THREADLINE_APPROVAL_POLICIES": orjson.dumps(POLICIES).decode(),
        },
    )
    with harness.start("all", env=env, log_dir=directory) as handle:
        yield handle


@pytest.fixture(scope="module")
def tokens(server: harness.ServerHandle) -> dict[str, str]:
    return three_people(server)


def test_the_card_shows_the_escalated_stage_and_its_deadline(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Escalates to carol")
    bob = open_page(tokens["bob"], thread, label="bob")
    carol = open_page(tokens["carol"], thread, label="carol")
    send_from(bob, "email ops@example.com the deploy plan")
    api.wait(
        thread,
        "the escalation",
        lambda s: bool(s["pending_actions"]) and s["pending_actions"][0]["approval"]["stage"] == 1,
    )
    due = re.compile(r"^waiting for carol, due \d{1,2}:\d{2}( [AP]M)?, escalated: stage 2 of 2$")
    for tab in (bob, carol):
        expect(tab.get_by_test_id("approval-deadline")).to_have_text(due)
    expect(bob.get_by_test_id("action-refusal")).to_have_attribute("data-reason", "not_a_decider")
    expect(bob.get_by_test_id("approve-button")).to_be_disabled()
    shot(carol, "escalated")
    carol.get_by_test_id("approve-button").click()
    for tab in (bob, carol):
        expect(tab.get_by_test_id("pending-action")).to_have_count(0)
        expect_settled(tab)
        expect(tab.get_by_test_id("tool-decisions")).to_have_text(
            "Decided by Carol Check (approved)"
        )
