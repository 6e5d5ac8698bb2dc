"""One thread's UI: hide/unhide, regenerate, keyboard use, narrow screens, the README shot."""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.helpers import (
    Api,
    OpenPage,
    Shot,
    assistant_text,
    committed_assistant_texts,
    echo,
    expect_matches_snapshot,
    expect_settled,
    long_text,
    send_from,
    wait_loaded,
    wait_partial_stream,
)
from tests.e2e import harness

pytestmark = pytest.mark.browser

DOCS_SCREENSHOT = harness.ROOT / "docs" / "screenshot.png"
# Set to regenerate docs/screenshot.png (README) from test_readme_screenshot.
UPDATE_DOCS_ENV = "THREADLINE_UPDATE_DOCS_SCREENSHOT"
MAX_DOCS_SCREENSHOT_BYTES = 300_000

# Elements of the visible UI that stick out of the viewport, and the document's own overflow.
OVERFLOW_JS = """
() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  for (const el of [document.documentElement, document.body]) {
    if (el.scrollWidth > width) out.push(`${el.tagName} scrollWidth ${el.scrollWidth} > ${width}`);
  }
  const conv = document.getElementById('conversation');
  if (conv.scrollWidth > conv.clientWidth) {
    out.push(`conversation scrolls sideways: ${conv.scrollWidth} > ${conv.clientWidth}`);
  }
  for (const el of document.querySelectorAll('.topbar *, #main *, #sidebar.is-open *')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || el.closest('[hidden]')) continue;
    if (r.left < -0.5 || r.right > width + 0.5) {
      const id = el.dataset.testid || el.id || el.className || el.tagName;
      out.push(`${el.tagName} ${id}: ${Math.round(r.left)}..${Math.round(r.right)} of ${width}`);
    }
  }
  return out;
}
"""

# requestAnimationFrame callbacks run only after pending 0 ms timers, as on a loaded machine.
SLOW_FRAMES_JS = """
() => {
  const raf = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) => setTimeout(() => raf(callback), 30);
}
"""


def message(page: Page, message_id: str) -> Locator:
    return page.locator(f'[data-testid="message"][data-message-id="{message_id}"]')


def test_printed_url_moves_the_token_to_the_fragment(
    server: harness.ServerHandle, open_page: OpenPage, shot: Shot
) -> None:
    """The URL `threadline serve` prints opens the app; thread URLs are shareable."""
    printed = re.search(r"(http://\S+/#token=(\S+))", server.log())
    assert printed, server.log()[-2000:]
    url, token = printed.group(1), printed.group(2)
    assert url.startswith(server.url)
    tab = open_page(token, label="printed")
    tab.goto(url)
    wait_loaded(tab, None)
    # The token is in the fragment (never sent: no log, proxy or Referer sees it).
    expect(tab).to_have_url(f"{server.url}/#token={token}")
    expect(tab.locator("#empty-state")).to_be_visible()

    # Frames may come after timers (a busy machine): the composer must get the focus anyway.
    tab.evaluate(SLOW_FRAMES_JS)
    tab.get_by_test_id("new-thread-title").fill("Made in the browser")
    tab.get_by_test_id("new-thread-submit").click()
    expect(tab).to_have_url(re.compile(r"/\?thread=th_\w+#token="))
    thread = str(tab.evaluate("() => new URL(location.href).searchParams.get('thread')"))
    expect(tab).to_have_url(f"{server.url}/?thread={thread}#token={token}")
    current = tab.locator('[data-testid="thread-item"][aria-current="page"]')
    expect(current).to_have_text("Made in the browser")
    expect(tab.get_by_test_id("composer-input")).to_be_focused()
    send_from(tab, "hello from the first tab")
    expect(assistant_text(tab)).to_have_text([echo("hello from the first tab")])

    # The canonical URL, pasted into a fresh browser context, opens the same thread.
    other = open_page(token, thread, label="shared")
    expect(other.locator("#thread-title")).to_have_text("Made in the browser")
    expect(assistant_text(other)).to_have_text([echo("hello from the first tab")])
    expect(other).to_have_url(f"{server.url}/?thread={thread}#token={token}")


def test_hide_unhide_and_regenerate(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread("Hide and regenerate")
    for text in ("first question", "second question"):
        api.send(thread, text)
        api.wait_run(thread)
    tab_a = open_page(tokens["alice"], thread, label="alice")
    tab_b = open_page(tokens["bob"], thread, label="bob")
    both = (tab_a, tab_b)
    first, second = echo("first question"), echo("second question")
    expect(assistant_text(tab_a)).to_have_text([first, second])

    first_id = str(
        tab_a.locator('[data-testid="message"][data-role="assistant"]').first.get_attribute(
            "data-message-id"
        )
    )
    message(tab_a, first_id).get_by_test_id("hide-button").click()
    for tab in both:
        hidden = message(tab, first_id)
        expect(hidden).to_have_attribute("data-visibility", "hidden")
        expect(hidden.get_by_test_id("unhide-button")).to_be_visible()
        expect(hidden.get_by_test_id("hide-button")).to_have_count(0)
        expect(assistant_text(tab)).to_have_text([second])
    assert first_id not in [m["id"] for m in api.snapshot(thread)["messages"]]
    with_hidden = api.snapshot(thread, include_hidden=True)
    assert {m["id"]: m["visibility"] for m in with_hidden["messages"]}[first_id] == "hidden"
    for tab in both:
        expect_matches_snapshot(tab, with_hidden)
    shot(tab_a, "hidden")

    message(tab_b, first_id).get_by_test_id("unhide-button").click()
    for tab in both:
        expect(message(tab, first_id)).to_have_attribute("data-visibility", "visible")
        expect(assistant_text(tab)).to_have_text([first, second])
        expect_matches_snapshot(tab, api.snapshot(thread))

    # Only the last assistant reply offers Regenerate.
    replies = tab_a.locator('[data-testid="message"][data-role="assistant"]')
    expect(replies.first.get_by_test_id("regenerate-button")).to_have_count(0)
    last_id = str(replies.last.get_attribute("data-message-id"))
    replies.last.get_by_test_id("regenerate-button").click()

    def regenerated(snapshot: dict[str, Any]) -> bool:
        run, last = snapshot["run"], snapshot["messages"][-1]
        return (
            run is not None
            and run["status"] == "completed"
            and last["role"] == "assistant"
            and last["id"] != last_id
        )

    snapshot = api.wait(thread, "a regenerated reply", regenerated)
    assert len(snapshot["messages"]) == 4
    for tab in both:
        expect(message(tab, last_id)).to_have_count(0)
        expect(assistant_text(tab)).to_have_text([first, second])
        expect_settled(tab)
        expect_matches_snapshot(tab, snapshot)


def test_keyboard_enter_sends_and_tab_reaches_send(
    api: Api, tokens: dict[str, str], open_page: OpenPage
) -> None:
    thread = api.create_thread("Keyboard")
    tab = open_page(tokens["alice"], thread)
    composer = tab.get_by_test_id("composer-input")
    composer.focus()
    tab.keyboard.type("line one")
    tab.keyboard.press("Shift+Enter")
    tab.keyboard.type("line two")
    expect(composer).to_have_value("line one\nline two")  # Shift+Enter: a new line, no send
    expect(tab.get_by_test_id("message")).to_have_count(0)

    tab.keyboard.press("Enter")
    expect(composer).to_have_value("")
    expect(composer).to_be_focused()
    expect(assistant_text(tab)).to_have_count(1)
    snapshot = api.wait_run(thread)
    assert snapshot["messages"][0]["parts"][0]["text"] == "line one\nline two"
    expect_settled(tab)
    expect_matches_snapshot(tab, snapshot)

    # Tab goes from the composer to Send, and Enter on Send sends.
    composer.fill("sent with the button")
    composer.focus()
    tab.keyboard.press("Tab")
    expect(tab.get_by_test_id("send-button")).to_be_focused()
    tab.keyboard.press("Enter")
    expect(assistant_text(tab)).to_have_text(
        [echo("line one\nline two"), echo("sent with the button")]
    )
    expect_settled(tab)
    expect_matches_snapshot(tab, api.snapshot(thread))

    # The approval card: Enter in the note field does not submit (it would "click" Approve,
    # the form's default button); Tab reaches Approve, then Deny; Enter on Deny denies.
    api.send(thread, "email someone@example.com the notes")
    api.wait_pending(thread)
    note = tab.get_by_test_id("action-note")
    note.focus()
    tab.keyboard.type("typed, then Enter")
    tab.keyboard.press("Enter")
    tab.keyboard.press("Tab")
    expect(tab.get_by_test_id("approve-button")).to_be_focused()
    tab.keyboard.press("Tab")
    expect(tab.get_by_test_id("deny-button")).to_be_focused()
    tab.keyboard.press("Enter")
    expect(tab.get_by_test_id("pending-action")).to_have_count(0)
    expect(tab.get_by_test_id("tool-resolution")).to_have_text(
        "Action resolved by alice (approved: false, note: typed, then Enter)"
    )
    expect_settled(tab)


def test_narrow_viewport_has_no_horizontal_overflow(
    api: Api, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    thread = api.create_thread(
        "A narrow screen, and a thread title long enough that it has to wrap on a phone"
    )
    unbroken = "https://example.org/" + "x" * 160
    api.send(thread, f"Look at {unbroken} please")
    api.wait_run(thread)
    api.send(thread, f"email someone@example.com the link {unbroken}")
    api.wait_pending(thread)

    tab = open_page(tokens["alice"], thread, viewport={"width": 380, "height": 800})
    expect(tab.get_by_test_id("pending-action")).to_be_visible()
    expect(assistant_text(tab)).to_have_text([echo(f"Look at {unbroken} please")])
    assert tab.evaluate(OVERFLOW_JS) == []
    for testid in ("approve-button", "composer-input", "send-button", "stop-button"):
        element = tab.get_by_test_id(testid)
        element.scroll_into_view_if_needed()
        expect(element).to_be_in_viewport(ratio=1)
    shot(tab, "narrow")

    # The thread list is a drawer on narrow screens.
    toggle = tab.locator("#sidebar-toggle")
    expect(toggle).to_be_visible()
    toggle.click()
    expect(tab.get_by_test_id("thread-list")).to_be_visible()
    assert tab.evaluate(OVERFLOW_JS) == []
    shot(tab, "narrow-drawer")
    tab.keyboard.press("Escape")
    expect(tab.get_by_test_id("thread-list")).to_be_hidden()
    expect(toggle).to_be_focused()


def test_readme_screenshot(
    server: harness.ServerHandle, tokens: dict[str, str], open_page: OpenPage, shot: Shot
) -> None:
    """The main page with a pending approval card, in a scope of its own (a tidy thread list).

    Saved as an artifact; copied to docs/screenshot.png when THREADLINE_UPDATE_DOCS_SCREENSHOT=1.
    """
    token = tokens["maria"]
    api = Api(server.url, token)
    try:
        api.create_thread("Customer follow-ups")
        api.create_thread("Weekly planning")
        thread = api.create_thread("Launch party")
        api.send(thread, "What's the weather in Dubrovnik?")
        api.wait_run(thread)
        api.send(thread, "Lovely. Please email dana@example.com that we meet on the terrace.")
        api.wait_pending(thread)
    finally:
        api.close()
    tab = open_page(token, thread, viewport={"width": 1280, "height": 1100})
    expect(tab.get_by_test_id("pending-action")).to_be_visible()
    expect(assistant_text(tab)).to_have_count(1)
    expect(tab.get_by_test_id("thread-item")).to_have_count(3)
    tab.get_by_test_id("approve-button").scroll_into_view_if_needed()
    path = shot(tab, "approval")
    assert path.stat().st_size < MAX_DOCS_SCREENSHOT_BYTES
    if os.environ.get(UPDATE_DOCS_ENV) == "1":
        shutil.copyfile(path, DOCS_SCREENSHOT)


def test_retry_button_answers_a_cancelled_run_again(
    api: Api, tokens: dict[str, str], open_page: OpenPage
) -> None:
    """The Retry button appears for a cancelled (or failed) run and starts a retry run that
    replaces the cancelled reply; it is gone again once the retry completed."""
    thread = api.create_thread("Retry")
    tab = open_page(tokens["alice"], thread, label="alice")
    retry = tab.get_by_test_id("retry-button")
    expect(retry).to_be_hidden()
    text = long_text(130)
    full = echo(text)
    send_from(tab, text)
    wait_partial_stream(tab, full, min_chars=40)
    tab.get_by_test_id("stop-button").click()
    expect_settled(tab, "cancelled")
    cancelled = api.snapshot(thread)
    [partial] = committed_assistant_texts(cancelled)
    assert partial != full
    expect(retry).to_be_visible()
    retry.click()

    def retried(snapshot: dict[str, Any]) -> bool:
        run = snapshot["run"]
        return (
            run is not None
            and run["id"] != cancelled["run"]["id"]
            and (run["status"] == "completed")
        )

    snapshot = api.wait(thread, "the retried run", retried)
    assert committed_assistant_texts(snapshot) == [full]
    assert cancelled["messages"][1]["id"] not in [m["id"] for m in snapshot["messages"]]
    expect_settled(tab)
    expect(retry).to_be_hidden()
    expect_matches_snapshot(tab, snapshot)
