"""Collaboration in Chromium on real processes: two gateways and a worker on Postgres and Redis.

Three tabs on two gateways see each other present (by the display names their tokens carry),
typing and reviewing; the example approvals service, started as a process, resolves actions that
tabs created in three threads, each exactly once, and every tab converges on the outcome.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect
from playwright.sync_api import Error as PlaywrightError

from tests.browser.conftest import DEFAULT_VIEWPORT, TIMEOUT_MS
from tests.browser.helpers import (
    REDACTED,
    WATCH_SCRIPT,
    Api,
    ConsoleLog,
    assistant_texts,
    committed_assistant_texts,
    expect_settled,
    send_from,
    wait_loaded,
)
from tests.e2e import cluster, harness
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

# Display names, minted with `threadline token create --name` as an operator does.
NAMES = {"ann": "Ann Lee", "bob": "Bob Marsh", "cara": "Cara Díaz"}
T = TypeVar("T")
SERVICE_TIMEOUT = 60.0  # a hang guard for the approvals service's start-up line


@dataclass
class Setup:
    cluster: cluster.Cluster
    tokens: dict[str, str]

    def gateway(self, index: int) -> harness.ServerHandle:
        return self.cluster.gateways[index]

    def api(self, name: str = "ann") -> Api:
        return Api(self.gateway(0).url, self.tokens[name])


def in_thread(call: Callable[[], T]) -> T:
    """Run `call` in a thread of its own: the cluster's set-up runs an asyncio loop, which
    cannot run in this thread while Playwright's sync API holds its loop here."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    require_postgres()
    require_redis()
    extra = {"THREADLINE_PRESENCE_REFRESH": "1.0", "THREADLINE_DEMO_DELAY_MS": "20"}
    stack = contextlib.ExitStack()
    running = in_thread(
        lambda: stack.enter_context(cluster.cluster(["gateway", "gateway", "worker"], extra=extra))
    )
    try:
        with ThreadPoolExecutor(max_workers=len(NAMES)) as pool:
            futures = {
                who: pool.submit(harness.create_token, running.env, "alpha", "user", who, name)
                for who, name in NAMES.items()
            }
            tokens = {who: future.result(timeout=120) for who, future in futures.items()}
        tokens |= running.tokens({"bot": ("alpha", "backend", "approvals-bot")})
        yield Setup(running, tokens)
    finally:
        in_thread(stack.close)  # drops the database: asyncio again


Tab = Callable[[str, int, str], Page]


@pytest.fixture
def tab(browser: Browser, setup: Setup, console: ConsoleLog) -> Iterator[Tab]:
    """tab(who, gateway index, thread id): that person's page, loaded, in its own profile."""
    contexts: list[BrowserContext] = []

    def open_(who: str, gateway: int, thread_id: str) -> Page:
        context = browser.new_context(viewport=DEFAULT_VIEWPORT)
        contexts.append(context)
        context.set_default_timeout(TIMEOUT_MS)
        context.add_init_script(WATCH_SCRIPT)
        page = context.new_page()
        console.attach(page, f"{who}@g{gateway + 1}")
        url = setup.gateway(gateway).url
        page.goto(f"{url}/?thread={thread_id}#token={setup.tokens[who]}")
        wait_loaded(page, thread_id)
        return page

    yield open_
    for context in contexts:
        with contextlib.suppress(PlaywrightError):
            context.close()


def here(page: Page) -> list[str]:
    items = page.get_by_test_id("presence").locator("li").all_text_contents()
    return sorted(str(item) for item in items)


def test_three_tabs_on_two_gateways_see_each_other(setup: Setup, tab: Tab) -> None:
    api = setup.api()
    thread_id = api.create_thread("Presence across gateways")
    places = {"ann": 0, "bob": 1, "cara": 1}  # gateway of each tab
    tabs = {who: tab(who, gateway, thread_id) for who, gateway in places.items()}
    for who, page in tabs.items():
        expect(page.get_by_test_id("presence").locator("li")).to_have_count(3)
        expected = sorted(
            f"{name} (you)" if other == who else name for other, name in NAMES.items()
        )
        assert here(page) == expected, who

    # Bob (gateway 2) types: the tab on gateway 1 and the other on gateway 2 show it.
    tabs["bob"].get_by_test_id("composer-input").press_sequentially("hi all")
    for who in ("ann", "cara"):
        expect(tabs[who].get_by_test_id("typing")).to_have_text("Bob Marsh is typing…")
    expect(tabs["bob"].get_by_test_id("typing")).to_have_text("")
    tabs["bob"].get_by_test_id("composer-input").fill("")
    expect(tabs["ann"].get_by_test_id("typing")).to_have_text("")

    # Cara (gateway 2) reviews an action: Ann (gateway 1) sees it by Cara's display name.
    api.send(thread_id, "please email team@example.com the notes")
    action = api.wait_pending(thread_id)
    card = tabs["cara"].get_by_test_id("pending-action")
    expect(card).to_have_attribute("data-action-id", action["id"])
    card.get_by_test_id("approve-button").focus()
    expect(tabs["ann"].get_by_test_id("action-reviewers")).to_have_text("Cara Díaz is reviewing")

    # Bob's tab closes: he leaves the tabs of both gateways.
    tabs["bob"].context.close()
    for who in ("ann", "cara"):
        expect(tabs[who].get_by_test_id("presence").locator("li")).to_have_count(2)
        assert not any("Bob" in line for line in here(tabs[who]))
    api.close()


def service_line(path: Path, process: subprocess.Popen[str], pattern: str) -> str:
    """Wait until the service's output file has a line matching `pattern` (or it died)."""
    deadline = time.monotonic() + SERVICE_TIMEOUT
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found.group(0)
        assert process.poll() is None, f"the service exited: {path.read_text()}"
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in the service's output: {path.read_text()}")


@pytest.fixture
def approvals_service(setup: Setup, tmp_path: Path) -> Iterator[Path]:
    """examples/approvals_service.py as a process on gateway 2; yields its output file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env |= {"THREADLINE_URL": setup.gateway(1).url, "THREADLINE_TOKEN": setup.tokens["bot"]}
    output = tmp_path / "approvals.out"
    with output.open("w") as out:  # a file, never an undrained pipe
        process = subprocess.Popen(
            [
                sys.executable,
                str(harness.ROOT / "examples" / "approvals_service.py"),
                "--allow-domain",
                "example.com",
            ],
            env=env,
            cwd=harness.ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        service_line(output, process, "watching the action inbox")
        yield output
    finally:
        process.terminate()
        try:
            process.wait(timeout=harness.STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=harness.STOP_TIMEOUT)


def test_the_approvals_service_resolves_actions_created_in_browser_tabs(
    setup: Setup, tab: Tab, approvals_service: Path
) -> None:
    api = setup.api()
    asks = {
        "ann": (0, "email ok@example.com the plan", f"Done: I sent the email to {REDACTED}."),
        "bob": (1, "email no@evil.test the keys", "I did not send the email."),
        "cara": (0, "email yes@example.com the date", f"Done: I sent the email to {REDACTED}."),
    }
    threads = {who: api.create_thread(f"approvals {who}") for who in asks}
    tabs = {who: tab(who, gateway, threads[who]) for who, (gateway, _, _) in asks.items()}
    # A second tab on Ann's thread, on the other gateway: it only watches.
    watcher = tab("bob", 1, threads["ann"])
    for who, (_, text, _) in asks.items():
        send_from(tabs[who], text)

    for who, (_, _, reply) in asks.items():
        expect_settled(tabs[who])
        expect(tabs[who].get_by_test_id("pending-action")).to_have_count(0)
        snapshot = api.snapshot(threads[who])
        texts = committed_assistant_texts(snapshot)
        assert texts[-1].startswith(reply), texts
        assert assistant_texts(tabs[who]) == texts  # the tab converged on committed state
        (part,) = [p for m in snapshot["messages"] for p in m["parts"] if p["type"] == "tool-call"]
        assert part["waiting"]["resolution"]["subject"] == "approvals-bot"
    expect_settled(watcher)
    assert assistant_texts(watcher) == assistant_texts(tabs["ann"])

    # Exactly once: one resolution line per action, and nothing of these threads left pending.
    lines = approvals_service.read_text().splitlines()
    for who, thread_id in threads.items():
        resolved = [line for line in lines if thread_id in line]
        assert len(resolved) == 1, lines
        assert resolved[0].startswith("refused" if who == "bob" else "approved"), resolved
    assert not any("already resolved" in line for line in lines), lines
    api.close()
