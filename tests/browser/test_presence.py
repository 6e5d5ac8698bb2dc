"""Presence in the page: three tabs see who is here, who types and who reviews an action."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.helpers import Api, OpenPage, Shot

pytestmark = pytest.mark.browser


def members(page: Page) -> list[str]:
    return [str(t) for t in page.get_by_test_id("presence").locator("li").all_text_contents()]


def test_tabs_show_who_is_here_typing_and_reviewing(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Presence")
    alice_1 = open_page(tokens["alice"], thread, label="alice-1")
    alice_2 = open_page(tokens["alice"], thread, label="alice-2")
    bob = open_page(tokens["bob"], thread, label="bob")
    here = alice_1.get_by_test_id("presence")
    expect(here.locator("li")).to_have_count(2)  # alice's two tabs are one person
    expect(here).to_contain_text("alice (you) (2 tabs)")
    expect(here).to_contain_text("bob")
    expect(bob.get_by_test_id("presence")).to_contain_text("alice (2 tabs)")
    expect(bob.get_by_test_id("presence")).to_contain_text("bob (you)")

    bob.get_by_test_id("composer-input").press_sequentially("hello the")
    for page in (alice_1, alice_2):
        expect(page.get_by_test_id("typing")).to_have_text("bob is typing…")
    expect(bob.get_by_test_id("typing")).to_have_text("")  # never yourself
    bob.get_by_test_id("composer-input").fill("")
    expect(alice_1.get_by_test_id("typing")).to_have_text("")

    api.send(thread, "please email someone@example.com the notes")
    action = api.wait_pending(thread)
    card = bob.get_by_test_id("pending-action")
    expect(card).to_have_attribute("data-action-id", action["id"])
    card.get_by_test_id("approve-button").focus()
    reviewers = alice_1.get_by_test_id("action-reviewers")
    expect(reviewers).to_have_text("bob is reviewing")
    expect(reviewers).to_have_attribute("role", "status")  # announced to screen readers
    shot(alice_1, "bob-reviewing")
    bob.get_by_test_id("composer-input").focus()
    expect(reviewers).to_have_text("")

    bob.context.close()  # the tab closes: bob leaves every other tab at once
    expect(here.locator("li")).to_have_count(1)
    expect(alice_2.get_by_test_id("presence")).not_to_contain_text("bob")
    assert members(alice_2) == ["alice (you) (2 tabs)"]
