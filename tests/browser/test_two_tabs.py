"""Two tabs on one thread: live streaming, approvals, redaction, reload and stop all converge."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, Route, expect

from tests.browser.helpers import (
    EMAIL_PATTERN_JS,
    REDACTED,
    Api,
    ConsoleLog,
    OpenPage,
    Shot,
    assistant_text,
    assistant_texts,
    committed_assistant_texts,
    echo,
    expect_matches_snapshot,
    expect_settled,
    long_text,
    send_from,
    wait_loaded,
    wait_partial_stream,
    watch_state,
)

pytestmark = pytest.mark.browser

ADDRESS = "someone@example.com"
APPROVED = f"Done: I sent the email to {REDACTED}."
# Only the snapshot route (GET /v1/threads/<id>?...), not the command routes under it.
SNAPSHOT_URL = re.compile(r"/v1/threads/[^/?#]+(\?[^#]*)?$")


def tool_resolution(page: Page) -> str:
    return str(page.get_by_test_id("tool-resolution").text_content())


def expect_approval_card(page: Page, action_id: str) -> None:
    card = page.get_by_test_id("pending-action")
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-action-id", action_id)
    expect(card.get_by_test_id("approve-button")).to_be_enabled()
    expect(card.get_by_test_id("deny-button")).to_be_enabled()
    expect(page.get_by_test_id("run-status")).to_have_text("waiting")
    expect(page.get_by_test_id("tool-call")).to_have_attribute("data-state", "awaiting-action")


def test_reply_streams_live_into_the_other_tab(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Two tabs")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")
    text = long_text(35)
    full = echo(text)

    send_from(tab_a, text)
    # B shows part of the reply while its run is still running: the stream, not the commit.
    partial = wait_partial_stream(tab_b, full, min_chars=20)
    expect(assistant_text(tab_b)).to_have_count(0)
    shot(tab_b, "streaming")
    assert len(partial) < len(full)

    for tab in (tab_a, tab_b):
        expect(assistant_text(tab)).to_have_text([full])
        expect_settled(tab)
    snapshot = api.snapshot(thread)
    assert committed_assistant_texts(snapshot) == [full]
    for tab in (tab_a, tab_b):
        expect_matches_snapshot(tab, snapshot)
        # Several growing states of the live text were rendered, not one final jump.
        assert watch_state(tab)["streamStates"] > 3, watch_state(tab)


def test_approval_in_one_tab_completes_the_run_in_the_other(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Approve from another tab")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")

    send_from(tab_a, f"email {ADDRESS} about the launch")
    action = api.wait_pending(thread)
    for tab in (tab_a, tab_b):
        expect_approval_card(tab, action["id"])
    shot(tab_a, "approval-card")
    # A pending action is committed state: it survives a reload.
    tab_a.reload()
    wait_loaded(tab_a, thread)
    expect_approval_card(tab_a, action["id"])

    tab_b.get_by_test_id("approve-button").click()

    expect(assistant_text(tab_a)).to_have_text([APPROVED])
    for tab in (tab_a, tab_b):
        expect(tab.get_by_test_id("pending-action")).to_have_count(0)
        expect_settled(tab)
        expect(tab.get_by_test_id("tool-call")).to_have_attribute("data-state", "output-available")
        expect(tab.get_by_test_id("tool-resolution")).to_have_text(
            "Action resolved by bob (approved: true)"
        )
        expect_matches_snapshot(tab, api.snapshot(thread))
    shot(tab_a, "approved")


def test_deny_with_a_note_from_the_other_tab(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Deny from another tab")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")

    send_from(tab_a, f"email {ADDRESS} the draft")
    action = api.wait_pending(thread)
    for tab in (tab_a, tab_b):
        expect_approval_card(tab, action["id"])
    note = "Not this week, thanks"
    tab_b.get_by_test_id("action-note").fill(note)
    tab_b.get_by_test_id("deny-button").click()

    denied = f"I did not send the email. Note: {note}"
    for tab in (tab_a, tab_b):
        expect(assistant_text(tab)).to_have_text([denied])
        expect(tab.get_by_test_id("pending-action")).to_have_count(0)
        expect_settled(tab)
        expect(tab.get_by_test_id("tool-resolution")).to_have_text(
            f"Action resolved by bob (approved: false, note: {note})"
        )
        expect_matches_snapshot(tab, api.snapshot(thread))
    snapshot = api.snapshot(thread)
    tool = snapshot["messages"][1]["parts"][0]
    # A denial never runs the tool (send_email's denial rule): the call ends rejected.
    assert tool["state"] == "rejected" and tool["error"] == f"denied: {note}", tool
    shot(tab_a, "denied")


def test_second_approval_is_refused_and_names_the_winner(
    api: Api, tokens: dict[str, str], open_page: OpenPage, console: ConsoleLog
) -> None:
    console.allow_failed_loads()  # the losing resume is answered 409 on purpose
    thread = api.create_thread("Both approve")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")
    send_from(tab_a, f"email {ADDRESS} now")
    action = api.wait_pending(thread)
    for tab in (tab_a, tab_b):
        expect_approval_card(tab, action["id"])

    # A is slow to learn about B's decision: its snapshot requests are held back.
    held: list[Route] = []
    holding = True

    def hold(route: Route) -> None:
        if holding:
            held.append(route)
        else:
            route.continue_()

    tab_a.route(SNAPSHOT_URL, hold)
    tab_b.get_by_test_id("approve-button").click()
    api.wait_run(thread)
    expect(tab_a.get_by_test_id("pending-action")).to_have_count(1)
    tab_a.get_by_test_id("approve-button").click()

    expect(tab_a.get_by_test_id("action-status")).to_have_text("Already resolved by bob")
    expect(tab_a.get_by_test_id("error-banner")).to_contain_text("Already resolved by bob")
    assert held, "A asked for no snapshot since B approved"
    holding = False
    for route in held:
        route.continue_()
    tab_a.unroute(SNAPSHOT_URL)
    expect(tab_a.get_by_test_id("pending-action")).to_have_count(0)
    expect(assistant_text(tab_a)).to_have_text([APPROVED])
    expect_settled(tab_a)
    expect_matches_snapshot(tab_a, api.snapshot(thread))
    expect(tab_a.get_by_test_id("tool-resolution")).to_have_text(
        "Action resolved by bob (approved: true)"
    )


def test_address_never_appears_in_assistant_text(
    api: Api, tokens: dict[str, str], open_page: OpenPage
) -> None:
    assert re.fullmatch(EMAIL_PATTERN_JS, ADDRESS)  # the pages' watcher would catch it
    thread = api.create_thread("Redaction")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")

    # A plain message: the echo streams the address (split across 5-character chunks).
    text = f"Forward this to {ADDRESS} and cc {ADDRESS} " + long_text(25) + f" to:{ADDRESS}"
    full = echo(text).replace(ADDRESS, REDACTED)
    send_from(tab_a, text)
    wait_partial_stream(tab_b, full, min_chars=40)
    for tab in (tab_a, tab_b):
        expect(assistant_text(tab)).to_have_text([full])
        expect_settled(tab)
    # The approval round trip: its confirmation names the recipient.
    send_from(tab_b, f"email {ADDRESS} the minutes")
    api.resume(thread, api.wait_pending(thread)["id"], {"approved": True})
    for tab in (tab_a, tab_b):
        expect(assistant_text(tab)).to_have_text([full, APPROVED])
        expect_settled(tab)

    snapshot = api.snapshot(thread)
    for tab in (tab_a, tab_b):
        seen = watch_state(tab)
        assert seen["streamStates"] > 3, seen  # the watcher did see the live stream
        assert seen["leaks"] == [], seen
        # The address is on the page, in the user's own messages and the tool input only.
        expect(tab.locator('[data-role="user"]').first).to_contain_text(ADDRESS)
        tab.reload()
        wait_loaded(tab, thread)
        expect_matches_snapshot(tab, snapshot)
        assert watch_state(tab)["leaks"] == []
        assert all(ADDRESS not in t for t in assistant_texts(tab))
        assert sum(t.count(REDACTED) for t in assistant_texts(tab)) == 4
    assert all(ADDRESS not in t for t in committed_assistant_texts(snapshot))


def test_reload_mid_stream_converges_to_the_committed_state(
    api: Api, tokens: dict[str, str], open_page: OpenPage
) -> None:
    thread = api.create_thread("Reload")
    tab = open_page(tokens["alice"], thread, label="alice")
    text = long_text(60)
    full = echo(text)
    send_from(tab, text)
    wait_partial_stream(tab, full, min_chars=20)

    tab.reload()
    assert api.run_status(thread) == "running", "the reload did not happen mid-stream"
    wait_loaded(tab, thread)
    # The reloaded page joins the stream in flight (chunks are replayed to late joiners).
    wait_partial_stream(tab, full, min_chars=1)

    snapshot = api.wait_run(thread)
    expect(assistant_text(tab)).to_have_text([full])
    expect_settled(tab)
    expect_matches_snapshot(tab, snapshot)
    assert committed_assistant_texts(snapshot) == [full]


def test_stop_from_the_other_tab_commits_the_partial_reply(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Stop")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")
    text = long_text(130)
    full = echo(text)
    send_from(tab_a, text)
    wait_partial_stream(tab_b, full, min_chars=40)

    stop = tab_b.get_by_test_id("stop-button")
    expect(stop).to_be_visible()
    stop.click()

    for tab in (tab_a, tab_b):
        expect_settled(tab, "cancelled")
    snapshot = api.snapshot(thread)
    assert snapshot["run"]["status"] == "cancelled"
    committed = committed_assistant_texts(snapshot)
    assert len(committed) == 1, snapshot["messages"]
    partial = committed[0]
    assert full.startswith(partial), partial
    assert len(echo("")) + 20 < len(partial) < len(full), partial
    for tab in (tab_a, tab_b):
        expect(assistant_text(tab)).to_have_text([partial])
        expect_matches_snapshot(tab, snapshot)
    shot(tab_a, "stopped")


def test_queued_messages_show_in_both_tabs_and_can_be_cancelled(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Queue")
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")
    text = long_text(60)
    send_from(tab_a, text)
    wait_partial_stream(tab_b, echo(text), min_chars=10)
    # Input that arrives during a run is queued, not appended.
    send_from(tab_b, "queued one")
    send_from(tab_b, "queued two")
    for tab in (tab_a, tab_b):
        expect(tab.get_by_test_id("queue-item")).to_have_count(2)
        expect(tab.get_by_test_id("queue-item").first).to_contain_text("queued one")
    shot(tab_a, "queued")
    tab_a.get_by_test_id("queue-cancel").first.click()
    for tab in (tab_a, tab_b):
        expect(tab.get_by_test_id("queue-item")).to_have_count(1)

    snapshot = api.wait(
        thread,
        "both replies",
        lambda s: s["run"]["status"] == "completed" and not s["queue"] and len(s["messages"]) == 4,
    )
    for tab in (tab_a, tab_b):
        expect(assistant_text(tab)).to_have_text([echo(text), echo("queued two")])
        expect(tab.get_by_test_id("queue-item")).to_have_count(0)
        expect_settled(tab)
        expect_matches_snapshot(tab, snapshot)
