"""The browser page served through nginx, in Chromium (the browser suite's helpers)."""

from __future__ import annotations

import os

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS
from tests.browser.helpers import (
    WATCH_SCRIPT,
    Api,
    ConsoleLog,
    assistant_text,
    committed_assistant_texts,
    echo,
    expect_matches_snapshot,
    expect_settled,
    send_from,
    wait_loaded,
    watch_state,
)
from tests.deploy.stack import Stack


def diagnosis(stack: Stack, page: Page, console: ConsoleLog) -> str:
    """What a page that never connected saw, and what the gateways logged: the console's
    errors, the watch script's record, each gateway's last lines."""
    console.flush()
    lines = [f"console: {console.entries}", f"page saw: {watch_state(page)}"]
    for gateway in stack.containers("gateway"):
        lines.append(f"--- {gateway}\n" + "\n".join(stack.logs(gateway).splitlines()[-30:]))
    return "\n".join(lines)


def check_page(stack: Stack, token: str) -> None:
    """Open the page on a new thread, send a message, see the reply stream and settle as the
    HTTP snapshot says; then ask for an e-mail and see the address never shown."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    api = Api(stack.url, token)
    console = ConsoleLog()
    try:
        thread_id = api.create_thread("browser via nginx")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                context = browser.new_context()
                context.set_default_timeout(TIMEOUT_MS)
                context.add_init_script(WATCH_SCRIPT)
                page = context.new_page()
                console.attach(page, "page")
                page.goto(f"{stack.url}/?thread={thread_id}#token={token}")
                try:
                    wait_loaded(page, thread_id)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{diagnosis(stack, page, console)}") from exc

                text = " ".join(f"page{i:02d}" for i in range(30))
                send_from(page, text)
                expect(assistant_text(page)).to_have_text([echo(text)])
                expect_settled(page)
                expect_matches_snapshot(page, api.snapshot(thread_id))

                send_from(page, "email erin@example.com the notes")
                action = api.wait_pending(thread_id)
                api.resume(thread_id, action["id"], {"approved": True})
                final = api.wait_run(thread_id, timeout=30)
                expect(assistant_text(page)).to_have_text(committed_assistant_texts(final))
                expect_settled(page)
                expect_matches_snapshot(page, api.snapshot(thread_id))
                assert watch_state(page)["leaks"] == []
                console.flush()
                assert console.problems() == []
            finally:
                browser.close()
    finally:
        api.close()
