"""Browser fixtures: a real server, Chromium, pages per token and thread, console checks, shots."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    ViewportSize,
    expect,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError

from tests.browser.helpers import WATCH_SCRIPT, Api, ConsoleLog, OpenPage, wait_loaded
from tests.e2e import harness

# Debian's package; THREADLINE_TEST_CHROMIUM names another Chromium/Chrome binary.
CHROMIUM = Path(os.environ.get("THREADLINE_TEST_CHROMIUM") or "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = harness.ROOT / "test-artifacts" / "browser"
# Slow enough that a reply of a few hundred characters streams for seconds.
DEMO_DELAY_MS = "30"
TIMEOUT_MS = 10_000
DEFAULT_VIEWPORT: ViewportSize = {"width": 1280, "height": 800}

REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()

expect.set_options(timeout=TIMEOUT_MS)


# --- hooks ---------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so fixtures know at teardown whether it failed."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A test that passed fails anyway when its pages logged console errors."""
    result = yield
    log = getattr(item, "funcargs", {}).get("console")
    if isinstance(log, ConsoleLog):
        log.flush()
        problems = log.problems()
        if problems:
            raise AssertionError("console errors in the page(s):\n" + "\n".join(problems))
    return result


# --- server and browser --------------------------------------------------------------------


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.ServerHandle]:
    """One real `threadline serve` (embedded default, demo agent) for the browser suite."""
    directory = tmp_path_factory.mktemp("browser-server")
    env = harness.server_env(
        harness.sqlite_url(directory), {"THREADLINE_DEMO_DELAY_MS": DEMO_DELAY_MS}
    )
    handle = harness.start("all", env=env, log_dir=directory)
    try:
        yield handle
    finally:
        code = handle.stop()
        assert code in (0, -15), f"server exited with {code}\n{handle.log()[-4000:]}"


@pytest.fixture(scope="package")
def tokens(server: harness.ServerHandle) -> dict[str, str]:
    """alice and bob: users of scope demo; maria: a user of scope acme (a tidy thread list)."""
    specs = {"alice": "demo", "bob": "demo", "maria": "acme"}
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {
            name: pool.submit(server.token, scope, "user", name) for name, scope in specs.items()
        }
        return {name: future.result(timeout=60) for name, future in futures.items()}


@pytest.fixture(scope="package", autouse=True)
def chromium_present() -> None:
    """Skip the browser suite without Chromium (before starting a server); fail under CI=true."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing (apt-get install chromium, or THREADLINE_TEST_CHROMIUM)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="package")
def playwright(chromium_present: None) -> Iterator[Playwright]:
    """One driver for the suite (the sync API allows one per thread): modules that need a
    Chromium launched differently launch it from here."""
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    instance = playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def api(server: harness.ServerHandle, tokens: dict[str, str]) -> Iterator[Api]:
    """The HTTP API as alice."""
    client = Api(server.url, tokens["alice"])
    try:
        yield client
    finally:
        client.close()


# --- console errors ------------------------------------------------------------------------


@pytest.fixture
def console() -> ConsoleLog:
    return ConsoleLog()


# --- pages and screenshots -----------------------------------------------------------------


def artifact_name(node: pytest.Item, state: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{node.name}-{state}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / f"{name}.png"


@pytest.fixture
def shot(request: pytest.FixtureRequest) -> Callable[[Page, str], Path]:
    """shot(page, state) saves test-artifacts/browser/<test-name>-<state>.png."""

    def save(page: Page, state: str) -> Path:
        path = artifact_name(request.node, state)
        page.screenshot(path=str(path), animations="disabled", caret="hide")
        return path

    return save


@pytest.fixture
def open_page(
    request: pytest.FixtureRequest,
    browser: Browser,
    server: harness.ServerHandle,
    console: ConsoleLog,
) -> Iterator[OpenPage]:
    """open_page(token, thread_id) -> a page in a fresh browser context, connected and loaded.

    The URL is the canonical shareable one, `/?thread=<id>#token=<token>`. Every page gets the
    watch script of helpers.py and reports its console errors to `console`.
    """
    contexts: list[tuple[str, BrowserContext, Page]] = []

    def open_(
        token: str,
        thread_id: str | None = None,
        *,
        label: str = "",
        viewport: ViewportSize | None = None,
    ) -> Page:
        label = label or f"page{len(contexts) + 1}"
        context = browser.new_context(viewport=viewport or DEFAULT_VIEWPORT)
        context.set_default_timeout(TIMEOUT_MS)
        context.add_init_script(WATCH_SCRIPT)
        page = context.new_page()
        contexts.append((label, context, page))
        console.attach(page, label)
        query = f"?thread={thread_id}" if thread_id else ""
        page.goto(f"{server.url}/{query}#token={token}")
        wait_loaded(page, thread_id)
        return page

    yield open_

    reports: dict[str, Any] = request.node.stash.get(REPORTS, {})
    failed = any(report.failed for report in reports.values())
    for label, context, page in contexts:
        if failed and not page.is_closed():
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(artifact_name(request.node, f"failure-{label}")))
        context.close()
    if failed:
        print(f"--- server log (tail) ---\n{server.log()[-3000:]}")
