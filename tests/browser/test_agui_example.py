"""The AG-UI browser example (examples/agui_browser): @ag-ui/client in Chromium, no bundler."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.browser.conftest import DEMO_DELAY_MS
from tests.browser.helpers import ConsoleLog
from tests.e2e import harness
from tests.e2e.jsclients import require_node_clients

EXAMPLE = harness.ROOT / "examples" / "agui_browser" / "serve.py"
# Unbundled, the client is a few hundred ES modules: the first load of a page takes a while.
LOAD_TIMEOUT_MS = 90_000


def printed_url(path: Path, process: subprocess.Popen[str], timeout: float) -> str:
    """The URL serve.py prints first, read from its stdout file (waits on the file, no sleep
    of a fixed length: polls until the line is there or the process died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"(http://\S+)", path.read_text())
        if found:
            return found.group(1)
        assert process.poll() is None, f"serve.py exited with {process.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"serve.py printed no URL within {timeout} s")


@pytest.fixture(scope="module")
def example_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`serve.py` as a user runs it: Threadline plus the page; yields the URL it prints.

    Its output goes to files, never to a pipe nobody drains: at info level every module request
    is an access line (~38 KB per page load), and a full 64 KiB pipe blocks the server's event
    loop in the middle of the second tab's load (the intermittent hang of this test).
    """
    require_node_clients()
    directory: Path = tmp_path_factory.mktemp("agui-example")
    # info: the access lines are written, so the test would hang again if they went to a pipe.
    env = harness.server_env(
        harness.sqlite_url(directory),
        {"THREADLINE_DEMO_DELAY_MS": DEMO_DELAY_MS, "THREADLINE_LOG_LEVEL": "info"},
    )
    port = harness.free_port()
    out_path, err_path = directory / "serve.out", directory / "serve.log"
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", str(port)],
            env=env,
            cwd=harness.ROOT,
            stdout=out,
            stderr=err,
            text=True,
        )
    try:
        url = printed_url(out_path, process, harness.START_TIMEOUT)
        harness.wait_healthy(f"http://127.0.0.1:{port}", process, harness.START_TIMEOUT)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=harness.STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()  # an open event stream can hold uvicorn's graceful shutdown
            process.wait(timeout=harness.STOP_TIMEOUT)


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """One browser profile for both tabs, so the second one loads the modules from cache."""
    profile = browser.new_context()
    try:
        yield profile
    finally:
        profile.close()


def open_page(context: BrowserContext, console: ConsoleLog, url: str, label: str) -> Page:
    page = context.new_page()
    console.attach(page, label)
    page.goto(url, timeout=LOAD_TIMEOUT_MS)  # the page imports a few hundred modules
    # The module sets the thread id once it loaded, and then joins the thread.
    expect(page.locator("#thread")).not_to_have_text("", timeout=LOAD_TIMEOUT_MS)
    return page


def test_weather_and_approval_from_a_second_tab(
    context: BrowserContext, console: ConsoleLog, example_url: str
) -> None:
    first = open_page(context, console, example_url, "first")
    first.fill("#text", "weather in Paris")
    first.click("text=Send")
    expect(first.locator("#log .assistant").last).to_contain_text("The weather in Paris is")

    first.fill("#text", "email ann.lee@example.com about the picnic")
    first.click("text=Send")
    expect(first.locator("#interrupts button", has_text="Approve")).to_be_visible()

    # The same thread in a second tab: it joins, sees the pending approval, and answers it.
    second = open_page(context, console, first.url, "second")
    expect(second.locator("#log .tool")).to_contain_text("partly cloudy")
    second.locator("#interrupts button", has_text="Approve").click()
    done = "Done: I sent the email to [redacted email]."
    expect(second.locator("#log .assistant").last).to_have_text(
        f"assistant: {done}", timeout=LOAD_TIMEOUT_MS
    )
    expect(second.locator("#status")).to_have_text("")

    # The first tab catches up by joining. Assistant text never shows the address (the tool
    # call's own input does: redaction is of what the assistant says).
    first.click("#join")
    expect(first.locator("#log .assistant").last).to_have_text(f"assistant: {done}")
    for page in (first, second):
        said = page.locator("#log .assistant", has_not_text="→").all_inner_texts()
        assert said and all("ann.lee@example.com" not in line for line in said)
