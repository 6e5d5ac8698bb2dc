"""Helpers of the browser tests: an HTTP client for ground truth and page queries."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from playwright.sync_api import ConsoleMessage, Locator, Page, ViewportSize, expect
from playwright.sync_api import Error as PlaywrightError

if TYPE_CHECKING:
    from tests.e2e.harness import ServerHandle

# Every e-mail address the demo redactor would redact (runtime/demo/redact.py, as JS).
EMAIL_PATTERN_JS = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
REDACTED = "[redacted email]"
ASSISTANT_TEXT = (
    '[data-testid="message"][data-role="assistant"][data-visibility="visible"] '
    '[data-testid="message-text"]'
)

# Installed in every page before the client runs: a MutationObserver that sees every rendered
# state of the live reply and of committed assistant text, records how much streamed text it
# saw, and records any e-mail address that ever showed up in assistant text.
WATCH_SCRIPT = """
(() => {
  const email = new RegExp(__EMAIL__);
  const tl = (window.__tl = { maxStream: 0, streamStates: 0, lastStream: '', leaks: [] });
  const check = () => {
    const live = document.querySelector('[data-testid="streaming-text"]');
    const text = live ? live.textContent : '';
    if (text !== tl.lastStream) {
      tl.lastStream = text;
      if (text) tl.streamStates += 1;
    }
    if (text.length > tl.maxStream) tl.maxStream = text.length;
    const texts = [text];
    for (const el of document.querySelectorAll(
      '[data-testid="message"][data-role="assistant"] [data-testid="message-text"]'))
      texts.push(el.textContent);
    for (const t of texts) {
      const match = email.exec(t);
      if (match && tl.leaks.length < 20) tl.leaks.push(match[0]);
    }
  };
  new MutationObserver(check).observe(document, {
    subtree: true, childList: true, characterData: true, attributes: true,
  });
})();
""".replace("__EMAIL__", json.dumps(EMAIL_PATTERN_JS))


class OpenPage(Protocol):
    """The `open_page` fixture: a page for `token` on `thread_id` in a fresh browser context."""

    def __call__(
        self,
        token: str,
        thread_id: str | None = None,
        *,
        label: str = "",
        viewport: ViewportSize | None = None,
    ) -> Page: ...


Shot = Callable[[Page, str], Path]


class Api:
    """The HTTP API with one bearer token: the ground truth the pages must converge to."""

    def __init__(self, base_url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0
        )

    def close(self) -> None:
        self.http.close()

    def create_thread(self, title: str) -> str:
        response = self.http.post("/v1/threads", json={"title": title})
        assert response.status_code == 201, response.text
        return str(response.json()["thread"]["id"])

    def snapshot(self, thread_id: str, *, include_hidden: bool = False) -> dict[str, Any]:
        params = {"include_hidden": "true"} if include_hidden else {}
        response = self.http.get(f"/v1/threads/{thread_id}", params=params)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def send(self, thread_id: str, text: str) -> dict[str, Any]:
        response = self.http.post(f"/v1/threads/{thread_id}/messages", json={"text": text})
        assert response.status_code == 202, response.text
        return dict(response.json())

    def resume(self, thread_id: str, action_id: str, payload: dict[str, Any]) -> None:
        response = self.http.post(
            f"/v1/threads/{thread_id}/actions/{action_id}/resume", json={"payload": payload}
        )
        assert response.status_code == 200, response.text

    def wait(self, thread_id: str, what: str, predicate: Any, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        snapshot: dict[str, Any] = {}
        while time.monotonic() < deadline:
            snapshot = self.snapshot(thread_id)
            if predicate(snapshot):
                return snapshot
            time.sleep(0.03)
        raise AssertionError(f"{thread_id} never reached {what}: {snapshot}")

    def wait_run(
        self, thread_id: str, statuses: tuple[str, ...] = ("completed",), timeout: float = 15.0
    ) -> dict[str, Any]:
        return dict(
            self.wait(
                thread_id,
                f"run status {statuses}",
                lambda s: s["run"] is not None and s["run"]["status"] in statuses,
                timeout,
            )
        )

    def wait_pending(self, thread_id: str) -> dict[str, Any]:
        snapshot = self.wait(thread_id, "a pending action", lambda s: bool(s["pending_actions"]))
        return dict(snapshot["pending_actions"][0])

    def run_status(self, thread_id: str) -> str | None:
        run = self.snapshot(thread_id)["run"]
        return None if run is None else str(run["status"])


def echo(text: str) -> str:
    """The demo agent's reply to a plain message."""
    return f"You said: {text}"


def long_text(words: int, prefix: str = "") -> str:
    """A message of plain words (no address characters runs for the redactor to hold back)."""
    return (prefix + " ".join(f"word{i}" for i in range(words))).strip()


def committed_assistant_texts(snapshot: dict[str, Any]) -> list[str]:
    return [
        str(part["text"])
        for message in snapshot["messages"]
        if message["role"] == "assistant" and message.get("visibility", "visible") == "visible"
        for part in message["parts"]
        if part["type"] == "text"
    ]


def assistant_texts(page: Page) -> list[str]:
    """Exact text of every visible assistant text part, in order (textContent, not innerText)."""
    return list(page.locator(ASSISTANT_TEXT).evaluate_all("els => els.map(e => e.textContent)"))


def message_ids(page: Page) -> list[str]:
    return list(
        page.get_by_test_id("message").evaluate_all("els => els.map(e => e.dataset.messageId)")
    )


def assistant_text(page: Page) -> Locator:
    return page.locator(ASSISTANT_TEXT)


def streaming(page: Page) -> Locator:
    return page.get_by_test_id("streaming-text")


def wait_partial_stream(page: Page, full: str, min_chars: int = 1, timeout: float = 10_000) -> str:
    """Wait until the live reply shows a strict prefix of `full` (at least `min_chars` long)
    while the page's run status says running; return that text."""
    handle = page.wait_for_function(
        """([full, min]) => {
          const t = document.querySelector('[data-testid="streaming-text"]').textContent;
          const status = document.querySelector('[data-testid="run-status"]').textContent;
          return status === 'running' && t.length >= min && t.length < full.length ? t : null;
        }""",
        arg=[full, min_chars],
        timeout=timeout,
        polling=10,
    )
    text = str(handle.json_value())
    assert full.startswith(text), f"streamed {text!r} is not a prefix of {full!r}"
    return text


def expect_settled(page: Page, run_status: str = "completed") -> None:
    """The run is over on `page` and nothing is left in the live (streaming) area."""
    expect(page.get_by_test_id("run-status")).to_have_text(run_status)
    expect(streaming(page)).to_have_text("")
    expect(page.get_by_test_id("live-message")).to_have_class(re.compile(r"\bis-empty\b"))
    expect(page.get_by_test_id("stop-button")).to_be_hidden()


def expect_matches_snapshot(page: Page, snapshot: dict[str, Any]) -> None:
    """The page shows exactly the committed messages of `snapshot` (ids and assistant text)."""
    expect(assistant_text(page)).to_have_text(committed_assistant_texts(snapshot))
    assert assistant_texts(page) == committed_assistant_texts(snapshot)
    assert message_ids(page) == [m["id"] for m in snapshot["messages"]]


def watch_state(page: Page) -> dict[str, Any]:
    """What the watch script saw on the current page load."""
    return dict(page.evaluate("() => window.__tl"))


def wait_loaded(page: Page, thread_id: str | None) -> None:
    """Connected, subscribed and (with a thread) the thread's snapshot rendered."""
    expect(page.get_by_test_id("connection-state")).to_have_text("connected")
    if thread_id:
        expect(page.locator("#thread-view")).to_be_visible()
        expect(page.locator("#thread-title")).not_to_have_text("Loading…")


def send_from(page: Page, text: str) -> None:
    """Type `text` into the composer and click Send; the composer empties once it is accepted."""
    page.get_by_test_id("composer-input").fill(text)
    page.get_by_test_id("send-button").click()
    expect(page.get_by_test_id("composer-input")).to_have_value("")


# Chromium logs every 4xx/5xx answer to fetch() as a console error with this text.
FAILED_LOAD = re.compile(r"^Failed to load resource: the server responded with a status of 4\d\d")


@dataclass
class ConsoleLog:
    """Console errors and uncaught exceptions of every page a test opened."""

    pages: list[Page] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    failed_loads_allowed: bool = False

    def allow_failed_loads(self) -> None:
        """The test causes 4xx answers on purpose: Chromium's resource messages are expected."""
        self.failed_loads_allowed = True

    def attach(self, page: Page, label: str) -> None:
        self.pages.append(page)

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                self.entries.append(f"[{label}] console.error: {message.text} {message.location}")

        def on_error(error: PlaywrightError) -> None:
            self.entries.append(f"[{label}] uncaught: {error.message}\n{error.stack or ''}")

        page.on("console", on_console)
        page.on("pageerror", on_error)

    def flush(self) -> None:
        """Let pending console events of open pages reach Python."""
        for page in self.pages:
            if not page.is_closed():
                with contextlib.suppress(PlaywrightError):
                    page.evaluate("0")

    def problems(self) -> list[str]:
        return [
            entry
            for entry in self.entries
            if not (self.failed_loads_allowed and FAILED_LOAD.search(entry.split(": ", 1)[-1]))
        ]


def three_people(server: ServerHandle) -> dict[str, str]:
    """Tokens of alice, bob and carol (display names set: the approval cards show them), minted
    at once."""
    people = {"alice": "Alice Ask", "bob": "Bob Builder", "carol": "Carol Check"}
    with ThreadPoolExecutor(max_workers=len(people)) as pool:
        futures = {
            who: pool.submit(server.token, "demo", "user", who, name)
            for who, name in people.items()
        }
        return {who: future.result(timeout=60) for who, future in futures.items()}
