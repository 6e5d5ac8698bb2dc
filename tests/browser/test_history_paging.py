"""A long thread in the browser: the snapshot shows its last messages, scrolling up loads older
pages (the reader keeps their place) until the first message, and live updates keep them."""

from __future__ import annotations

import sqlite3
from urllib.parse import urlsplit

import orjson
import pytest
from playwright.sync_api import Page, Request, expect

from tests.browser.helpers import Api, OpenPage, echo
from tests.e2e import harness

pytestmark = pytest.mark.browser

TOTAL = 250  # two and a half pages of the default 100
PAGE = 100
MESSAGES = '[data-testid="message"]'


def fill_thread(server: harness.ServerHandle, thread_id: str, count: int) -> None:
    """Commit `count` messages straight into the server's SQLite file (that many runs through
    the API would take minutes; the page only reads committed rows) and bump the version."""
    path = urlsplit(server.env["THREADLINE_DATABASE_URL"]).path
    rows = [
        (
            f"msg_{thread_id}_{n:03d}",
            thread_id,
            n,
            "user" if n % 2 == 0 else "assistant",
            orjson.dumps([{"type": "text", "text": f"history line {n}"}]).decode(),
            "visible",
            float(n),
            float(n),
        )
        for n in range(count)
    ]
    with sqlite3.connect(path, timeout=10) as db:
        db.executemany(
            "INSERT INTO messages (id, thread_id, position, role, parts, visibility, run_id,"
            " client_request_id, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
            rows,
        )
        db.execute("UPDATE threads SET version = version + 1 WHERE id = ?", (thread_id,))


def message_id(thread_id: str, n: int) -> str:
    return f"msg_{thread_id}_{n:03d}"


def scroll_to_top(page: Page) -> None:
    page.eval_on_selector("#conversation", "el => { el.scrollTop = 0; }")


def in_view(page: Page, selector: str) -> bool:
    """Whether the element shows inside the conversation's visible area."""
    return bool(
        page.eval_on_selector(
            selector,
            """el => {
              const box = el.getBoundingClientRect();
              const view = document.getElementById('conversation').getBoundingClientRect();
              return box.bottom > view.top && box.top < view.bottom;
            }""",
        )
    )


def test_scrolling_up_loads_older_pages_of_a_long_thread(
    server: harness.ServerHandle, api: Api, tokens: dict[str, str], open_page: OpenPage
) -> None:
    thread_id = api.create_thread("a long thread")
    fill_thread(server, thread_id, TOTAL)
    page = open_page(tokens["alice"], thread_id)
    older_requests: list[str] = []

    def watch(request: Request) -> None:
        if "before=" in request.url:
            older_requests.append(request.url)

    page.on("request", watch)
    messages = page.locator(MESSAGES)
    # Only the snapshot's window: the last hundred, scrolled to the newest.
    expect(messages).to_have_count(PAGE)
    expect(messages.first).to_have_attribute("data-message-id", message_id(thread_id, TOTAL - PAGE))
    expect(messages.last).to_contain_text(f"history line {TOTAL - 1}")
    assert in_view(page, f'[data-message-id="{message_id(thread_id, TOTAL - 1)}"]')

    # Scroll-up: the page before the oldest shown, in front, and the reader keeps their place.
    top_before = message_id(thread_id, TOTAL - PAGE)
    scroll_to_top(page)
    expect(messages).to_have_count(2 * PAGE)
    expect(messages.first).to_have_attribute(
        "data-message-id", message_id(thread_id, TOTAL - 2 * PAGE)
    )
    assert in_view(page, f'[data-message-id="{top_before}"]')
    assert page.eval_on_selector("#conversation", "el => el.scrollTop") > 40

    # Again: the last, shorter page reaches the first message; then there is nothing older.
    scroll_to_top(page)
    expect(messages).to_have_count(TOTAL)
    expect(messages.first).to_have_attribute("data-message-id", message_id(thread_id, 0))
    expect(messages.first).to_contain_text("history line 0")
    scroll_to_top(page)  # nothing older: no request (checked after the live update below)
    ids = page.eval_on_selector_all(MESSAGES, "els => els.map((e) => e.dataset.messageId)")
    assert ids == [message_id(thread_id, n) for n in range(TOTAL)]

    # A live reply slides the snapshot's window; the loaded pages stay in front of it.
    api.send(thread_id, "one more")
    api.wait_run(thread_id)
    expect(messages).to_have_count(TOTAL + 2)
    expect(messages.last).to_contain_text(echo("one more"))
    expect(messages.first).to_have_attribute("data-message-id", message_id(thread_id, 0))
    assert len(older_requests) == 2, older_requests
    assert "before=150" in older_requests[0] and "before=50" in older_requests[1]
