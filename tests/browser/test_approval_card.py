"""Three tabs of three people on a quorum-2, four-eyes approval: the requester sees why it may
not decide, the two others approve, every tab shows the progress live and ends resolved."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import Api, OpenPage, Shot, expect_settled, send_from, three_people
from tests.e2e import harness

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    """A server whose send_email needs two approvals, never the requester's
    (tests/e2e/approvals_agent)."""
    directory = tmp_path_factory.mktemp("approval-card")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "PYTHONPATH": str(harness.ROOT),
            "THREADLINE_AGENT": "tests.e2e.approvals_agent:agent",
            "THREADLINE_DEMO_DELAY_MS": "0",
        },
    )
    with harness.start("all", env=env, log_dir=directory) as handle:
        yield handle


@pytest.fixture(scope="module")
def tokens(server: harness.ServerHandle) -> dict[str, str]:
    return three_people(server)


def test_three_people_on_a_quorum_of_two_with_four_eyes(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Two approvals, not mine")
    alice = open_page(tokens["alice"], thread, label="alice")
    bob = open_page(tokens["bob"], thread, label="bob")
    carol = open_page(tokens["carol"], thread, label="carol")
    tabs = (alice, bob, carol)

    send_from(alice, "email ops@example.com the deploy plan")
    action = api.wait_pending(thread)
    for tab in tabs:
        pending = tab.get_by_test_id("pending-action")
        expect(pending).to_have_attribute("data-action-id", action["id"])
        expect(pending.get_by_test_id("approval-policy")).to_have_text(
            "Policy: needs 2 of: anyone allowed · not the requester (alice)"
        )
        expect(pending.get_by_test_id("approval-progress")).to_have_text("0 of 2 approvals")
    # The requester sees why, and no enabled button; the two others may decide.
    refusal = alice.get_by_test_id("action-refusal")
    expect(refusal).to_have_attribute("data-reason", "requester_excluded")
    expect(refusal).to_contain_text("You requested this")
    expect(alice.get_by_test_id("approve-button")).to_be_disabled()
    expect(alice.get_by_test_id("deny-button")).to_be_disabled()
    for tab in (bob, carol):
        expect(tab.get_by_test_id("action-refusal")).to_have_count(0)
        expect(tab.get_by_test_id("approve-button")).to_be_enabled()
    shot(alice, "requester")

    bob.get_by_test_id("approve-button").click()
    # Every tab shows the partial decision live; bob now sees he has decided.
    for tab in tabs:
        expect(tab.get_by_test_id("approval-progress")).to_have_text(
            "1 of 2 approvals, by Bob Builder"
        )
        expect(tab.get_by_test_id("approval-decision")).to_have_text(["Bob Builder: approved"])
    expect(bob.get_by_test_id("action-refusal")).to_have_attribute("data-reason", "already_decided")
    expect(bob.get_by_test_id("approve-button")).to_be_disabled()
    expect(carol.get_by_test_id("approve-button")).to_be_enabled()
    expect(alice.get_by_test_id("approve-button")).to_be_disabled()
    shot(carol, "one-of-two")

    carol.get_by_test_id("approve-button").click()
    for tab in tabs:
        expect(tab.get_by_test_id("pending-action")).to_have_count(0)
        expect_settled(tab)
        expect(tab.get_by_test_id("tool-call")).to_have_attribute("data-state", "output-available")
        expect(tab.get_by_test_id("tool-decisions")).to_have_text(
            "Decided by Bob Builder (approved), Carol Check (approved)"
        )
    snapshot = api.snapshot(thread)
    assert snapshot["run"]["status"] == "completed" and not snapshot["pending_actions"]
    shot(alice, "resolved")
