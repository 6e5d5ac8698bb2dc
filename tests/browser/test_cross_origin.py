"""A page on another origin drives Threadline with @ag-ui/client through CORS, in Chromium."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, expect

from tests.browser.conftest import DEMO_DELAY_MS
from tests.browser.helpers import ConsoleLog
from tests.browser.test_agui_example import EXAMPLE, LOAD_TIMEOUT_MS, printed_url
from tests.e2e import harness
from tests.e2e.jsclients import require_node_clients


@pytest.fixture(scope="module")
def page_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The example page (and the client modules), served by serve.py on an origin of its own."""
    require_node_clients()
    directory: Path = tmp_path_factory.mktemp("page-origin")
    env = harness.server_env(harness.sqlite_url(directory))
    port = harness.free_port()
    out_path = directory / "serve.out"
    with out_path.open("w") as out, (directory / "serve.log").open("w") as err:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", str(port)],
            env=env,
            cwd=harness.ROOT,
            stdout=out,
            stderr=err,
            text=True,
        )
    try:
        printed_url(out_path, process, harness.START_TIMEOUT)
        harness.wait_healthy(f"http://127.0.0.1:{port}", process, harness.START_TIMEOUT)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=harness.STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=harness.STOP_TIMEOUT)


@pytest.fixture(scope="module")
def api_server(
    tmp_path_factory: pytest.TempPathFactory, page_port: int
) -> Iterator[harness.ServerHandle]:
    """Threadline on another port (another origin), allowing only the page's 127.0.0.1 origin."""
    directory = tmp_path_factory.mktemp("api-origin")
    env = harness.server_env(
        harness.sqlite_url(directory),
        {
            "THREADLINE_DEMO_DELAY_MS": DEMO_DELAY_MS,
            "THREADLINE_CORS_ALLOWED_ORIGINS": f'["http://127.0.0.1:{page_port}"]',
        },
    )
    with harness.start("all", env, log_dir=directory) as handle:
        yield handle


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    profile = browser.new_context()
    try:
        yield profile
    finally:
        profile.close()


def test_a_listed_origin_runs_the_agent_and_approves_an_action(
    context: BrowserContext, console: ConsoleLog, page_port: int, api_server: harness.ServerHandle
) -> None:
    token = api_server.token("demo", "user", "alice")
    page = context.new_page()
    console.attach(page, "cross-origin")
    url = f"http://127.0.0.1:{page_port}/agui/#token={token}&server={api_server.url}"
    page.goto(url, timeout=LOAD_TIMEOUT_MS)
    expect(page.locator("#thread")).not_to_have_text("", timeout=LOAD_TIMEOUT_MS)
    page.fill("#text", "email ann.lee@example.com about the picnic")
    page.click("text=Send")
    page.locator("#interrupts button", has_text="Approve").click(timeout=LOAD_TIMEOUT_MS)
    expect(page.locator("#log .assistant").last).to_have_text(
        "assistant: Done: I sent the email to [redacted email].", timeout=LOAD_TIMEOUT_MS
    )
    expect(page.locator("#status")).to_have_text("")


def test_an_origin_not_listed_is_refused_by_the_browser(
    context: BrowserContext, console: ConsoleLog, page_port: int, api_server: harness.ServerHandle
) -> None:
    # localhost and 127.0.0.1 are different origins: the same page, not on the list.
    # A scope of its own: the thread list below then shows only what this page could open.
    token = api_server.token("blocked-origin", "user", "mallory")
    page = context.new_page()
    blocked: list[str] = []
    page.on("console", lambda message: blocked.append(message.text))
    url = f"http://localhost:{page_port}/agui/#token={token}&server={api_server.url}"
    page.goto(url, timeout=LOAD_TIMEOUT_MS)
    expect(page.locator("#status")).to_contain_text("Failed to fetch", timeout=LOAD_TIMEOUT_MS)
    assert any("CORS policy" in text for text in blocked), blocked
    # The preflight failed, so the run was never sent: no thread was opened for mallory.
    listed = httpx.get(
        f"{api_server.url}/v1/threads", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert listed.status_code == 200 and listed.json()["threads"] == []
